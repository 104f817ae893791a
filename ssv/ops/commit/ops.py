"""Launcher of the device commit: one launch for every layer's compaction and compressed blocks, where
the tensor version (`kv_commit_naive`) is ~35 small kernels."""
from __future__ import annotations

from typing import Optional

import torch
import triton

from ssv.config import NSAConfig
from ssv.ops.commit.kernels import kv_advance_fwd_kernel, kv_commit_fwd_kernel
from ssv.ops.pdl import pdl_args


def kv_commit(k: torch.Tensor, v: torch.Tensor, cmp: Optional[torch.Tensor], dlen: torch.Tensor,
              path: torch.Tensor, n: torch.Tensor, nsa: Optional[NSAConfig], hist: Optional[torch.Tensor] = None,
              tokens: Optional[torch.Tensor] = None) -> None:
    """As `kv_commit_naive`; dlen is advanced (and hist written) by a second one-program launch after
    the kernel, whose programs all read the old length."""
    lyr, h, t, d = k.shape
    if v.shape != k.shape or v.stride() != k.stride() or k.stride(3) != 1 or d & (d - 1):
        raise ValueError(f"kv_commit: k and v must share shape and strides, rows contiguous, D a power of "
                         f"two; got {tuple(k.shape)}, {tuple(v.shape)}")
    if nsa is not None and (cmp is None or cmp.shape[:3] != (2, lyr, h) or cmp.shape[4] != d or cmp.stride(4) != 1):
        raise ValueError("kv_commit: cmp must be [2, Lyr, H, NB + 1, D] with contiguous rows")
    if hist is not None and (hist.dim() != 1 or hist.dtype != torch.long or tokens is None or tokens.dim() != 1
                             or tokens.dtype != torch.long or not hist.is_contiguous() or not tokens.is_contiguous()):
        raise ValueError("kv_commit: hist and tokens must be contiguous 1-D int64 tensors")
    r = path.numel()
    c = cmp if nsa is not None else k
    l, st = (nsa.cmp_block, nsa.cmp_stride) if nsa is not None else (1, 1)
    kv_commit_fwd_kernel[(lyr * h,)](
        k, v, c, dlen, path.contiguous(), n, t, (cmp.shape[3] - 1) if nsa is not None else 0,
        k.stride(0), k.stride(1), k.stride(2), c.stride(0), c.stride(1), c.stride(2), c.stride(3), h,
        R=r, D=d, L_CMP=l, BL=triton.next_power_of_2(l), STRIDE=st, M=r // st + 1, NSA=nsa is not None,
        **pdl_args(k.device), num_warps=2)
    write = hist is not None
    if not write:
        hist, tokens = dlen, n      # placeholders, not read without HIST
    m = tokens.numel()
    kv_advance_fwd_kernel[(1,)](dlen, n, hist, tokens, m, hist.numel(), HIST=write, BM=triton.next_power_of_2(m),
                                num_warps=1, **pdl_args(k.device))
