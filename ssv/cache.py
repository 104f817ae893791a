"""Static KV cache with incrementally maintained compressed K/V and a scratch area for draft trees.

Slots [0, length) hold the committed sequence (slot = position). A step writes its N new tokens to
slots [length, length + N): a prefill chunk or decode token is then committed in place; a draft tree
lives there as scratch until one root-to-leaf path is compacted into [length, length + a) and the
rest is simply overwritten later.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch

from ssv.config import NSAConfig
from ssv.ops.nsa.naive import num_cmp_blocks


class KVCache:
    def __init__(self, n_layers: int, n_kv_heads: int, head_dim: int, max_len: int, scratch: int = 256,
                 nsa: Optional[NSAConfig] = None, dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "cpu"):
        if max_len <= 0 or scratch < 0:
            raise ValueError("KVCache: max_len must be positive and scratch non-negative")
        self.max_len, self.scratch, self.nsa = max_len, scratch, nsa
        shape = (n_layers, n_kv_heads, max_len + scratch, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        n_cmp = num_cmp_blocks(max_len, nsa) if nsa else 0
        # one block more than the context holds: the device commit's padded updates land there
        self._cmp = torch.zeros(2, n_layers, n_kv_heads, n_cmp + 1, head_dim, dtype=dtype, device=device)
        self.k_cmp, self.v_cmp = self._cmp[0, :, :, :n_cmp], self._cmp[1, :, :, :n_cmp]
        self.length = 0   # committed tokens
        self.n_cmp = 0    # compressed blocks up to date
        # the committed length on the device, read by the device-resident round (its kernels, slot
        # maps and commits); `sync_device` / `advance_host` hand it over between the two
        self.dlen = torch.zeros(1, dtype=torch.int32, device=device)
        # (cos, sin) [max_len + scratch, head_dim] by position, set by the Runner on CUDA: the fused
        # step's RoPE kernel reads its rows (every position a row of the cache can hold)
        self.rope = None

    def reset(self) -> None:
        self.length = self.n_cmp = 0
        self.dlen.zero_()

    def sync_device(self) -> None:
        """Host-side length -> device (after a prefill, before device rounds)."""
        self.dlen.fill_(self.length)

    def advance_host(self, n: int) -> None:
        """Device rounds committed n tokens: bring the host's bookkeeping along (no copy)."""
        self.length += n
        self.n_cmp = num_cmp_blocks(self.length, self.nsa) if self.nsa else 0

    def check_room(self, n_new: int) -> None:
        if self.length + n_new > self.max_len + self.scratch:
            raise ValueError(f"KV cache full: {self.length} committed + {n_new} new tokens exceed "
                             f"{self.max_len} + {self.scratch} scratch slots")

    def write(self, layer: int, k_new: torch.Tensor, v_new: torch.Tensor) -> None:
        """Store a step's new keys/values [N, Hkv, D] at slots [length, length + N)."""
        n = k_new.shape[0]
        self.check_room(n)
        self.k[layer, :, self.length:self.length + n] = k_new.transpose(0, 1).to(self.k.dtype)
        self.v[layer, :, self.length:self.length + n] = v_new.transpose(0, 1).to(self.v.dtype)

    def write_slots(self, layer: int, k_new: torch.Tensor, v_new: torch.Tensor, slots: torch.Tensor) -> None:
        """Store [N, Hkv, D] keys/values at device-given slots (the device round: no host length)."""
        self.k[layer].index_copy_(1, slots, k_new.transpose(0, 1).to(self.k.dtype))
        self.v[layer].index_copy_(1, slots, v_new.transpose(0, 1).to(self.v.dtype))

    def commit_device(self, path: torch.Tensor, n: torch.Tensor, kernel: Optional[bool] = None, hist=None,
                      tokens=None) -> None:
        """Device commit of a step: path [R] scratch offsets (root first, increasing, -1 padded) of which
        the first n [1] are accepted; they are compacted to [P, P + n), P advances and the compressed
        blocks they complete are filled. Fixed shapes: R and the block count bound the work. hist,
        tokens: also hist[P + 1 + i] = tokens[i] (`kv_commit_naive`). kernel (default: on CUDA):
        `ssv.ops.commit` in two launches instead of ~35 tensor ops."""
        if self.k.is_cuda if kernel is None else kernel:
            from ssv.ops.commit.ops import kv_commit
            kv_commit(self.k, self.v, self._cmp, self.dlen, path, n, self.nsa, hist, tokens)
        else:
            from ssv.ops.commit.naive import kv_commit_naive
            kv_commit_naive(self.k, self.v, self._cmp, self.dlen, path, n, self.nsa, hist, tokens)

    def commit(self, n: int) -> None:
        """Accept the step's first n new tokens in place (prefill chunk, decode token, chain prefix)."""
        if self.length + n > self.max_len:
            raise ValueError(f"context limit: {self.length} + {n} tokens exceed {self.max_len}")
        self.length += n
        self._update_compressed()

    def commit_path(self, nodes: Sequence[int]) -> None:
        """Compact the accepted tree nodes (scratch offsets, root first, in path order) and commit them."""
        nodes = [int(x) for x in nodes]
        room = self.max_len + self.scratch - self.length
        if any(not 0 <= x < room for x in nodes):
            raise ValueError(f"commit_path: node offsets must lie in [0, {room}) (the scratch area), got {nodes}")
        if any(b <= a for a, b in zip(nodes, nodes[1:])):
            raise ValueError("commit_path: nodes must be strictly increasing (parents precede children)")
        idx = torch.tensor(nodes, dtype=torch.long, device=self.k.device)
        src = self.length + idx
        dst = self.length + torch.arange(idx.numel(), device=idx.device)
        # src >= dst elementwise and increasing, so copying in one gather never reads an overwritten slot
        for t in (self.k, self.v):
            t.index_copy_(2, dst, t.index_select(2, src))
        self.commit(idx.numel())

    def _update_compressed(self) -> None:
        if self.nsa is None:
            return
        want = num_cmp_blocks(self.length, self.nsa)
        if want <= self.n_cmp:
            return
        l, st = self.nsa.cmp_block, self.nsa.cmp_stride
        lo, hi = self.n_cmp * st, (want - 1) * st + l
        for src, dst in ((self.k, self.k_cmp), (self.v, self.v_cmp)):
            win = src[:, :, lo:hi].float().unfold(2, l, st)                 # [Lyr, H, nb, D, l]
            dst[:, :, self.n_cmp:want] = win.mean(-1).to(dst.dtype)
        self.n_cmp = want
