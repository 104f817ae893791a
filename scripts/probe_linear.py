"""Moved into the package: `ssv bench linear` (ssv/bench/linear.py), which also writes this machine's
own table with --save. This wrapper keeps the old command line:

    python3 scripts/probe_linear.py OUT.json [--tiles PATH] [--pdl] [--batch-invariant] [--rope] ...
"""
import os
import shutil
import sys
import tempfile

from ssv.bench.linear import main

if __name__ == "__main__":
    out, rest = sys.argv[1], sys.argv[2:]
    with tempfile.TemporaryDirectory() as d:
        rc = main(["--out", d, *rest])
        os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
        shutil.copy(os.path.join(d, "probe-linear.json"), out)
    raise SystemExit(rc)
