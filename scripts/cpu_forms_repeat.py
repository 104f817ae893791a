"""How stable this machine's GEMM-form calibration is: `ssv.ops.linear.cpu.cpu_forms()` in N fresh
processes (each calibrates once, as `ssv generate` does), the form per row count 1..8 and for longer
steps, which CPU strategy (`ssv.cli.cpu_tree()`) each would pick and, where the package keeps them, the
calibration's layer-GEMM ms per probe rows in the form it chose (what the tree weighs since session 36).

    python scripts/cpu_forms_repeat.py [N] [out.json]
"""
from __future__ import annotations

import collections
import datetime
import json
import os
import subprocess
import sys

CHILD = ("import json; from ssv.ops.linear.cpu import cpu_forms; from ssv.cli import cpu_tree\n"
         "try:\n    from ssv.ops.linear.cpu import row_cost\n"
         "    ms = {r: round(row_cost(r) * 1e3, 2) for r in (1, 2, 3, 4, 6)}\n"
         "except ImportError:\n    ms = None   # a package before the calibration kept its times\n"
         "import torch, ssv.ops.linear.cpu as C\n"
         "cal = C._calibrated(torch.get_num_threads())\n"
         "every = {m: {f: round(t * 1e3, 2) for f, t in ts.items()} for m, ts in cal[2].items()} if len(cal) > 2 else None\n"
         "print(json.dumps({'forms': list(cpu_forms()), 'tree': list(cpu_tree()), 'ms': ms, 'every_ms': every}))")


def main(n: int = 5, out: str | None = None) -> None:
    env = {k: v for k, v in os.environ.items() if k != "SSV_CPU_GEMM"}   # calibrate, never a fixed form
    runs = []
    for i in range(n):
        res = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, env=env, check=True)
        runs.append(json.loads(res.stdout.strip().splitlines()[-1]))
        print(i, runs[-1]["forms"], "tree", runs[-1]["tree"], "ms", runs[-1]["ms"], flush=True)
        if runs[-1].get("every_ms"):    # every form's ms per probe rows (packages since session 39)
            print("   ", {m: ts for m, ts in runs[-1]["every_ms"].items()}, flush=True)
    four = collections.Counter(r["forms"][3] for r in runs)
    print("4-row form:", dict(four))
    for i, name in ((4, "5-8 rows"), (8, "longer steps")):
        print(f"{name} form:", dict(collections.Counter(r["forms"][i] for r in runs)))
    if out:
        import torch
        # SSV_COMMIT for a package run from elsewhere (PYTHONPATH); else this script's checkout, from any cwd
        commit = os.environ.get("SSV_COMMIT") or subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
            cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
        cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
        env_rec = dict(device=f"cpu ({os.cpu_count()} cores)", cpu=cpu, torch=torch.__version__,
                       date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), commit=commit)
        with open(out, "w") as f:
            json.dump(dict(env=env_rec, runs=runs, four_row_form=dict(four),
                           forms_5_8=dict(collections.Counter(r["forms"][4] for r in runs)),
                           forms_longer=dict(collections.Counter(r["forms"][8] for r in runs))), f, indent=1)
        print("wrote", out)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5, sys.argv[2] if len(sys.argv) > 2 else None)
