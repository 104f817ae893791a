"""Run the ssv CLI with launch-policy constants patched first, for side-by-side runs of a policy variant
without a commit: python3 scripts/patched.py ssv.ops.nsa.verify_policy.MAX_SPLITS=4 [...] -- bench e2e ...
(module.NAME=int, any number of them, then `--` and the CLI's arguments)."""
import importlib
import sys

if __name__ == "__main__":
    cut = sys.argv.index("--")
    for patch in sys.argv[1:cut]:
        name, val = patch.split("=")
        mod, attr = name.rsplit(".", 1)
        m = importlib.import_module(mod)
        if not hasattr(m, attr):
            raise SystemExit(f"patched.py: {mod} has no {attr}")
        setattr(m, attr, int(val))
        print(f"patched {mod}.{attr} = {val}", flush=True)
    from ssv.cli import main
    sys.exit(main(sys.argv[cut + 1:]))
