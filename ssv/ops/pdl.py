"""Programmatic dependent launch (PDL, Hopper and newer) for every Triton kernel of the decode step.

A graphed step is hundreds of launches of a few microseconds each, and the gap between two of them
(the next grid's launch after the previous one drains) is ~1 us. Launched with PDL, a kernel's
programs may be scheduled while the previous kernel is still finishing; each waits in `gdc_wait`
until that kernel has completed and its writes are visible, then lets the next launch begin.

The rule that keeps this safe: `pdl_prologue` is a kernel's first statement, before any load, store
or early exit. A kernel then completes only after its predecessor did, so completion stays ordered
along the chain and a kernel may read anything any earlier launch wrote. Launches that are not
Triton (cuBLAS, torch) wait for the previous kernel in full, as before.

The one thing a kernel may do before its wait is an L2 prefetch: `l2_prefetch_rows` pulls a GEMM's
weight tile, `l2_prefetch_tail` the last rows of a cache before a length in device memory (the
attention's window, the committed compressed keys), into L2 while the previous kernel still runs,
so that their first bytes, a DRAM round trip, are not on the chain's critical path. A prefetch
loads into no register and L2 is where every SM's writes land, so it cannot change a result; the
length `l2_prefetch_tail` loads forms addresses only. On an H100 this took the AR step from 0.924
to 0.869 ms at 4K (bench/results/gpu-s44/); the 48-row verify passes did not move.
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


@triton.jit
def _prefetch(ptrs):
    # one `prefetch.global.L2` a pointer (not pure: kept though its dummy result is unused)
    tl.inline_asm_elementwise("prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;", "=r,l", [ptrs], dtype=tl.int32,
                              is_pure=False, pack=1)


@triton.jit
def l2_prefetch_rows(p_rows, K: tl.constexpr, PDL: tl.constexpr):
    # p_rows [BN]: pointers to rows of K contiguous elements (a weight tile; the caller points rows
    # past the matrix at a real one); one `prefetch.global.L2` per 128-byte line, 8 lines a row at a
    # time (the last line repeated past K). Only with PDL: the interpreter has no inline assembly, and
    # without PDL a kernel starts after its predecessor ends, so there is nothing to overlap
    if PDL:
        E: tl.constexpr = 1024 // p_rows.dtype.element_ty.primitive_bitwidth     # elements a line
        NL: tl.constexpr = (K + E - 1) // E
        for l0 in tl.static_range(0, NL, 8):
            o_l = tl.minimum(l0 + tl.arange(0, 8), NL - 1) * E                   # [8]
            _prefetch(p_rows[:, None] + o_l[None, :])


@triton.jit
def l2_prefetch_span(base, lo, hi, s_row, part, parts, D: tl.constexpr, PDL: tl.constexpr):
    # rows [lo, hi) of a matrix with D contiguous elements a row (stride s_row) into L2: this program's
    # share (part of parts, 16 rows at a time), one prefetch a 128-byte line. lo / hi form addresses
    # only (from a length read before the PDL wait: a stale one could cost a miss, never a result)
    if PDL:
        E: tl.constexpr = 1024 // base.dtype.element_ty.primitive_bitwidth
        NL: tl.constexpr = (D + E - 1) // E
        NLP: tl.constexpr = 1 if NL <= 1 else (2 if NL <= 2 else (4 if NL <= 4 else 8))
        o_l = tl.minimum(tl.arange(0, NLP), NL - 1) * E                                  # [NLP]
        for r0 in range(lo + part * 16, hi, parts * 16):
            o_t = tl.minimum(r0 + tl.arange(0, 16), hi - 1)                                # [16]
            _prefetch(base + o_t[:, None] * s_row + o_l[None, :])


@triton.jit
def l2_prefetch_tail(base, end_ptr, n_rows, s_row, part, parts, D: tl.constexpr, PDL: tl.constexpr):
    # the last n_rows rows before row *end_ptr (rows [max(end - n_rows, 0), end)): `l2_prefetch_span`.
    # end_ptr is device state no kernel of the step writes (a length), loaded only to form addresses,
    # and n_rows bounds the loop whatever it reads
    if PDL:
        end = tl.load(end_ptr).to(tl.int64)
        l2_prefetch_span(base, tl.maximum(end - n_rows, 0), end, s_row, part, parts, D, PDL)


def pdl_args(device: torch.device) -> dict:
    """The PDL constexpr and the launch option for a kernel launched on `device`."""
    return {"PDL": True, "launch_pdl": True} if pdl(device) else {"PDL": False}
