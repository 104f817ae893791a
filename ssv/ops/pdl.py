"""Programmatic dependent launch (PDL, Hopper and newer) for every Triton kernel of the decode step.

A graphed step is hundreds of launches of a few microseconds each, and the gap between two of them
(the next grid's launch after the previous one drains) is ~1 us. Launched with PDL, a kernel's
programs may be scheduled while the previous kernel is still finishing; each waits in `gdc_wait`
until that kernel has completed and its writes are visible, then lets the next launch begin.

The rule that keeps this safe: `pdl_prologue` is a kernel's first statement, before any load, store
or early exit. A kernel then completes only after its predecessor did, so completion stays ordered
along the chain and a kernel may read anything any earlier launch wrote. Launches that are not
Triton (cuBLAS, torch) wait for the previous kernel in full, as before.
"""
from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from ssv.ops.utils import _index


@triton.jit
def pdl_prologue(PDL: tl.constexpr):
    if PDL:
        gdc_wait()
        gdc_launch_dependents()


@functools.lru_cache(maxsize=None)
def _hopper(index: int) -> bool:
    # the interpreter runs kernels on the host, which has no griddepcontrol (CUDA tensors included)
    interpreted = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
    return not interpreted and torch.cuda.get_device_capability(index)[0] >= 9


def pdl(device: torch.device) -> bool:
    """Whether kernels on `device` launch with PDL: CUDA of compute capability 9 or newer (never the
    interpreter, which runs on the CPU)."""
    return device.type == "cuda" and _hopper(_index(device))


def pdl_args(device: torch.device) -> dict:
    """The PDL constexpr and the launch option for a kernel launched on `device`."""
    return {"PDL": True, "launch_pdl": True} if pdl(device) else {"PDL": False}
