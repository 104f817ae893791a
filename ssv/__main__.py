"""`python -m ssv ...`: the same entry point as the `ssv` console script."""
from ssv.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
