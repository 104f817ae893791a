"""Registers, stack and shared memory of the verify launch's folded form (FOLD: the last KV split merges
them all) against its combine form, compiled for sm_90 here, at the default model's 4K / 48 and AR
(one query) and the Llama shape's 64K / 64: whether a change to the folded merge costs registers (a
lead for a device A/B, not a timing; session 49's chunked gather took ~196 -> ~250, bench/NOTES.md).
    python scripts/compile_verify_fold.py
"""
import os
import sys

os.environ.pop("TRITON_INTERPRET", None)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compile_launches as C  # noqa: E402
from sm90 import compile_sm90  # noqa: E402


def main():
    print(C.header())
    for shape, T, N in [("smollm2-135m", 4096, 48), ("smollm2-135m", 4096, 1), ("llama3.1-8b", 65536, 64)]:
        seen = set()
        for name, fn, args, warps, const in C.record_verify(shape, T, N):
            if name != "nsa_verify_fwd_kernel" or const.get("NWP", 99) > 16:   # the dense plan's window spans the cache
                continue
            key = (const["C"], const["APPROX"])
            if key in seen:
                continue
            seen.add(key)
            sig, const, stages = C.compile_args(fn, args, const)
            for fold in (False, True):
                _, (reg, stack, shared) = compile_sm90(fn, sig, {**const, "SPLIT": True, "FOLD": fold}, warps, stages)
                print(f"{shape:13s} {T:6d} {N:3d} C={const['C']:2d} approx={int(const['APPROX'])} BM={const['BM']:3d} "
                      f"fold={int(fold)}: {reg} registers, {stack} B stack, {shared} B shared")


if __name__ == "__main__":
    main()
