"""Seconds to import ssv.cli and `load_model('default', 'cpu')` in a fresh process, for package trees given
as ROOT=LABEL pairs, alternating REPEATS times (session 41: the meta-device init that imported torch._dynamo).
    python scripts/load_time_cpu.py OUT.json REPEATS ROOT=LABEL [ROOT=LABEL ...]
"""
from __future__ import annotations

import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile

CODE = ("import time; t = time.perf_counter(); from ssv.cli import load_model; "
        "load_model('default', 'cpu', progress=False); print(time.perf_counter() - t)")


def main(out: str, repeats: int, trees: list) -> None:
    runs = {label: [] for _, label in trees}
    with tempfile.TemporaryDirectory() as cwd:   # so that each ROOT's package is the one imported
        for _ in range(repeats):
            for root, label in trees:
                env = dict(os.environ, PYTHONPATH=root)
                res = subprocess.run([sys.executable, "-c", CODE], cwd=cwd, env=env, check=True, capture_output=True,
                                     text=True)
                runs[label].append(float(res.stdout.split()[-1]))
                print(f"{label:12s} {runs[label][-1]:.3f} s", flush=True)
    env = dict(device=f"cpu ({os.cpu_count()} cores)", date=datetime.datetime.now(datetime.timezone.utc).isoformat(
        timespec="seconds"), python=sys.version.split()[0])
    json.dump(dict(env=env, code=CODE, trees=[dict(root=r, label=l) for r, l in trees], seconds=runs,
                   median={k: statistics.median(v) for k, v in runs.items()}), open(out, "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), [tuple(a.split("=", 1)) for a in sys.argv[3:]])
