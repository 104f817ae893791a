"""Registers and stack of verify's approximate C = 16 launch (BM = 64) compiled for sm_90 here at its
policy's launch (`launch_config`: 4 warps) and at other (warps, stages): whether more warps remove its
spills (a lead for a device A/B, not a timing). Shapes as `compile_launches.py` records them.
    python scripts/compile_verify_warps.py
"""
import os
import sys

os.environ.pop("TRITON_INTERPRET", None)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compile_launches as C  # noqa: E402
from sm90 import compile_sm90  # noqa: E402


def main():
    print(C.header())
    for shape, T, N in [("llama3.1-8b", 65536, 48), ("smollm2-135m", 4096, 48)]:
        for name, fn, args, warps, const in C.record_verify(shape, T, N):
            if name != "nsa_verify_fwd_kernel" or not const.get("APPROX"):
                continue
            sig, const, stages = C.compile_args(fn, args, const)
            for w, st in [(warps, stages), (8, stages), (8, 2), (4, 2)]:
                reg, stack, shared = compile_sm90(fn, sig, const, w, st)[1]
                policy = " (policy)" if (w, st) == (warps, stages) else ""
                print(f"{shape:13s} {T:6d} {N:3d} C={const['C']} BM={const['BM']} {w} warps {st} stages: "
                      f"{reg} registers, {stack} B stack{policy}")
            break


if __name__ == "__main__":
    main()
