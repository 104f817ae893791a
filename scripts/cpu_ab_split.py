# Variants for scripts/cpu_step_ab.py: where a CPU step's time goes, by taking parts out (the outputs are then
# wrong; only the times mean anything): "all" the real step, "no-gemm" every layer GEMM and the head's replaced
# by a zero tensor of its shape, "no-gemm-no-nsa" also NSA's attention (CPU `NSAPlan.run`) by zeros.
import torch

import ssv.attention as _a
import ssv.draft.eagle3 as _e
import ssv.model.layers as _l
import ssv.model.llama as _m

_dense, _run = _l.dense, _a.NSAPlan.run


def _zeros(x, w, b=None):
    return x.new_zeros(x.shape[:-1] + (w.shape[0],))


def _no_run(self, layer, q, cache, gates=None):
    return torch.zeros_like(q)


def _set(d, r):
    _l.dense = _m.dense = _e.dense = d
    _a.NSAPlan.run = r


VARIANTS = {"all": (lambda: None, lambda: None),
            "no-gemm": (lambda: _set(_zeros, _run), lambda: _set(_dense, _run)),
            "no-gemm-no-nsa": (lambda: _set(_zeros, _no_run), lambda: _set(_dense, _run))}
