"""Autograd off for decoding, one rule for every entry point that decodes (the generate functions, the Runner's
forward and prefill, the DeviceEngine's step methods, the drafter's): inference mode on the CPU, no_grad elsewhere.

A CPU step is ~200 small ops a layer, each of which pays autograd's version counters and view tracking even
under no_grad; inference mode skips them (4-9% a phase, the same kernels and values: bench/results/cpu-s55/). A
CUDA step is graph replays, which pay no per-op host cost (not measured there: no_grad as before). Whatever an
entry point creates on the CPU (lazily built plans, buckets, scratch rows) is an inference tensor, which may be
changed in place only inside inference mode: hence every entry point, not only the generations, takes the rule,
so the engine and drafter can be driven directly after a generation and the other way round."""
from __future__ import annotations

import functools

import torch


def decoding(fn):
    """fn(obj, ...) with autograd off as above; obj is a Runner or drafter (`obj.device`) or an engine
    (`obj.runner.device`)."""
    @functools.wraps(fn)
    def run(obj, *args, **kwargs):
        dev = obj.device if hasattr(obj, "device") else obj.runner.device
        with torch.inference_mode() if torch.device(dev).type == "cpu" else torch.no_grad():
            return fn(obj, *args, **kwargs)
    return run
