"""A probe, not a feature: `ssv bench spec` with the context lookup's chain cut to CAP tokens when only a
2-token suffix matched (3- and 4-token matches keep K). Session 31 measured it on the CPU at 2K
(bench/results/cpu-s31/spec-2k-paired-lookup{3,5}-compact-cap2/, bench/NOTES.md): not adopted.

    PYTHONPATH=. python scripts/lookup_cap_cpu.py CAP bench spec ...   (the `ssv` arguments)
"""
import sys

import torch

import ssv.engine.spec as spec_mod
import ssv.spec.lookup as lookup_mod

_lookup = lookup_mod.context_lookup


def capped(cap):
    def lookup(hist, length, k, ngrams=lookup_mod.NGRAMS):
        t_long, v_long = _lookup(hist, length, k, (3, 4))
        t2, v2 = _lookup(hist, length, k, (2, 2))
        v2 = v2 & (torch.arange(k, device=v2.device) < cap)
        long = v_long[:1].expand(k)
        return torch.where(long, t_long, t2), torch.where(long, v_long, v2)
    return lookup


if __name__ == "__main__":
    lookup_mod.context_lookup = spec_mod.context_lookup = capped(int(sys.argv[1]))
    from ssv.cli import main
    sys.exit(main(sys.argv[2:]))
