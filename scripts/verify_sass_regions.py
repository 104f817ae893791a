"""Where the default model's strict verify launch (C = 4, 48 queries, 4K; `nsa_verify_fwd_kernel` as the
graphed pass launches it, compiled for sm_90 without a GPU) spends its static instructions: the SASS
before its first K/V tile load (the group's union, the work list and its barrier: every program runs it
once), the rest, and the loops' back edges. ncu (bench/results/gpu-s45/ncu-verify-4k48.txt) counted
2,335 executed instructions a warp at ~3 items a program; this says how many of them the prologue can be.
    python scripts/verify_sass_regions.py"""
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compile_launches import compile_args, record_verify  # noqa: E402
from sm90 import compile_sm90, sass_lines  # noqa: E402


def main():
    launches = [x for x in record_verify("smollm2-135m", 4096, 48) if x[0] == "nsa_verify_fwd_kernel"]
    name, fn, args, warps, const = next(x for x in launches if x[4].get("C") == 4 and not x[4].get("APPROX"))
    sig, consts, stages = compile_args(fn, args, const)
    cc, use = compile_sm90(fn, sig, consts, warps, stages)
    lines = sass_lines(cc)
    ops = [re.sub(r"^\s*/\*[0-9a-f]+\*/\s*(@!?U?P\w+\s+)?", "", ln).split()[0] for ln in lines]
    first = {k: next((i for i, o in enumerate(ops) if o.startswith(k)), None) for k in ("UTMALDG", "HMMA", "BAR")}
    back = [i for i, ln in enumerate(lines) if "BRA" in ln and int(re.search(r"0x([0-9a-f]+)", ln.split("BRA")[1]).group(1), 16)
            < int(re.match(r"\s*/\*([0-9a-f]+)\*/", ln).group(1), 16)]
    shown = {k: consts[k] for k in ("C", "CQ", "CE", "BM", "BS", "NSEL", "NWP", "NTB", "SPLIT", "FOLD", "LAZY", "TMA")}
    print(f"nsa_verify_fwd_kernel {shown} warps {warps} stages {stages}: REG {use[0]} STACK {use[1]} SHARED {use[2]}")
    print(f"static SASS instructions {len(ops)}; first UTMALDG at {first['UTMALDG']}, first HMMA at {first['HMMA']}, "
          f"first BAR at {first['BAR']}; backward branches (loops) at {back}")
    cut = first["UTMALDG"] or 0
    print(f"before the first K/V tile load: {cut} instructions, of them "
          + ", ".join(f"{k} {sum(o.startswith(k) for o in ops[:cut])}" for k in ("LDG", "STG", "BAR", "SHFL", "ISETP", "LOP3", "IMAD")))


if __name__ == "__main__":
    main()
