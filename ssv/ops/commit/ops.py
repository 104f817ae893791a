"""Launcher of the device commit: one launch for every layer's compaction and compressed blocks, where
the tensor version (`kv_commit_naive`) is ~35 small kernels."""
from __future__ import annotations

from typing import Optional

import torch
import triton

from ssv.config import NSAConfig
from ssv.ops.commit.kernels import kv_commit_fwd_kernel
from ssv.ops.pdl import pdl_args


def kv_commit(k: torch.Tensor, v: torch.Tensor, cmp: Optional[torch.Tensor], dlen: torch.Tensor,
              path: torch.Tensor, n: torch.Tensor, nsa: Optional[NSAConfig]) -> None:
    """As `kv_commit_naive`; dlen is advanced by a second (one-element) launch after the kernel, whose
    programs all read the old length."""
    lyr, h, t, d = k.shape
    if v.shape != k.shape or v.stride() != k.stride() or k.stride(3) != 1 or d & (d - 1):
        raise ValueError(f"kv_commit: k and v must share shape and strides, rows contiguous, D a power of "
                         f"two; got {tuple(k.shape)}, {tuple(v.shape)}")
    if nsa is not None and (cmp is None or cmp.shape[:3] != (2, lyr, h) or cmp.shape[4] != d or cmp.stride(4) != 1):
        raise ValueError("kv_commit: cmp must be [2, Lyr, H, NB + 1, D] with contiguous rows")
    r = path.numel()
    c = cmp if nsa is not None else k
    l, st = (nsa.cmp_block, nsa.cmp_stride) if nsa is not None else (1, 1)
    kv_commit_fwd_kernel[(lyr * h,)](
        k, v, c, dlen, path.contiguous(), n, t, (cmp.shape[3] - 1) if nsa is not None else 0,
        k.stride(0), k.stride(1), k.stride(2), c.stride(0), c.stride(1), c.stride(2), c.stride(3), h,
        R=r, D=d, L_CMP=l, BL=triton.next_power_of_2(l), STRIDE=st, M=r // st + 1, NSA=nsa is not None,
        **pdl_args(k.device), num_warps=2)
    dlen.add_(n.to(torch.int32))
