"""Attention plans of the device-resident round: the prefix length is read from device memory.

`plan(plen, positions, tree_mask)` derives the step's metadata with tensor ops (slot map, path
compression weights, the committed compressed-block count) and `run(layer, ...)` only launches, so
a whole step is capturable in one CUDA graph that replays at any context length: no Python int
derived from the length reaches a kernel argument, a grid or a shape. Launches are sized for the
cache's capacity; the kernels' idle programs exit early.

On the CPU (or `backend="reference"`) the same round code runs through `RefDevicePlan`, which
reads the length once per step (free there) and defers to the reference plans.
"""
from __future__ import annotations

from typing import Optional

import torch

from ssv.attention import DensePlan, NSAPlan, StepMeta, VerifyOptions, _same_blocks
from ssv.cache import KVCache
from ssv.config import NSAConfig


class _DevicePlanBase:
    def plan(self, plen: torch.Tensor, positions: torch.Tensor, tree_mask: torch.Tensor) -> "_DevicePlanBase":
        """plen [1] int32 committed length; positions [N] (P + depth); tree_mask [N, N] bool."""
        self.plen, self.positions, self.tree_mask = plen, positions, tree_mask
        self._slots = None
        self._plan()
        if self._slots is None:   # a plan whose launch does not write them
            n, ar = positions.numel(), getattr(self, "_ar", None)
            if ar is None or ar.numel() != n or ar.device != positions.device:
                self._ar = ar = torch.arange(n, device=positions.device)   # made once: a launch less a step
            self._slots = plen.long() + ar
        return self

    def _plan(self) -> None:
        pass

    def slots(self, cache: KVCache, n: int) -> torch.Tensor:
        return self._slots


class RefDevicePlan(_DevicePlanBase):
    """The reference ops behind the device plan's interface (CPU; the length is read on the host)."""

    def __init__(self, attention: str, cfg: Optional[NSAConfig], opts: Optional[VerifyOptions] = None):
        self.attention, self.cfg, self.opts = attention, cfg, opts

    def _plan(self) -> None:
        from ssv.engine.sync_guard import host_read
        with host_read():   # the reference plans take a host length: this plan is never captured
            meta = StepMeta(int(self.plen), self.positions, self.tree_mask)
            self.inner = (DensePlan(meta, check=False) if self.attention == "dense"
                          else NSAPlan(meta, self.cfg, self.opts))

    def run(self, layer, q, cache, gates=None):
        from ssv.engine.sync_guard import host_read
        with host_read():
            return self.inner.run(layer, q, cache, gates)


class KernelNSAPlan(_DevicePlanBase):
    """NSA on the Triton kernels with a device-resident length (routing at refresh layers, then the
    grouped verify launch), as `TritonNSAPlan` does with a host one."""

    def __init__(self, cfg: NSAConfig, opts: Optional[VerifyOptions], n: int, cache: KVCache, n_heads: int):
        from ssv.ops.nsa.verify import num_counters
        if cfg.gating == "union_cmp":
            raise ValueError("the Triton kernels implement gatings 'union' and 'gated', not 'union_cmp'")
        if not _same_blocks(cache.nsa, cfg) or cache.k_cmp.shape[2] == 0:
            raise ValueError("the cache keeps no compressed blocks for this NSA configuration")
        self.cfg, self.opts = cfg, opts or VerifyOptions()
        hkv, dev = cache.k.shape[1], cache.k.device
        # the folded merges' counters: zero, left zero by every launch
        self._counters = torch.zeros(num_counters(n, n_heads, hkv, self.opts.group_size), device=dev,
                                     dtype=torch.int32)
        self._meta = None

    def _plan(self) -> None:
        # the step's metadata in one launch (`nsa_plan`) into fixed buffers: its torch twin,
        # `path_block_weights_device`, was ~80 launches of a ~530-node AR step
        from ssv.ops.nsa.plan import PlanBuffers, nsa_plan
        n = self.positions.numel()
        if self._meta is None or self._meta.n != n:
            self._meta = PlanBuffers(n, self.cfg, self.positions.device)
        m = nsa_plan(self.plen, self.positions, self.tree_mask, self.cfg, self._meta)
        self.w, self.s0, self.n_path, self.nbpre, self.tmask = m.w, m.s0, m.n_path, m.nbpre, m.tmask
        self._slots = m.slots   # the cache rows P + i, from the same launch (no cast and add launches)
        self._indices = None

    def run(self, layer, q, cache, gates=None):
        from ssv.ops.nsa.route import nsa_route
        from ssv.ops.nsa.verify import nsa_verify
        cfg, opts = self.cfg, self.opts
        k, v = cache.k[layer], cache.v[layer]
        gated = cfg.gating == "gated"
        refresh = opts.refreshes(layer) or self._indices is None
        o_cmp = None
        if refresh or gated:
            idx, _, _, o_cmp = nsa_route(q, cache.k_cmp[layer], cache.v_cmp[layer], self.nbpre, k, v, self.w,
                                         self.s0, self.n_path, self.positions, cfg, want_o=gated,
                                         max_pos=k.shape[1] - 1)
            if refresh:
                self._indices = idx
        o, _, _ = nsa_verify(q, k, v, self.plen, self.positions, self.tmask, self._indices, cfg.slc_block,
                             cfg.window, opts.group_size, opts.precision == "approx", gates, o_cmp,
                             counters=self._counters)
        return o


class KernelDensePlan(_DevicePlanBase):
    """Dense attention over the prefix (flash-decoding tiles, KV splits, log-sum-exp merge) plus the tree
    part under its ancestor mask: `dense_verify`, every (query, head) row of a KV head on one tile, so a
    K/V tile is read once for the step (ssv/ops/dense)."""

    def _plan(self) -> None:
        self.tmask = self.tree_mask.to(torch.uint8)

    def run(self, layer, q, cache, gates=None):
        from ssv.ops.dense import dense_verify
        return dense_verify(q, cache.k[layer], cache.v[layer], self.plen, self.tmask)


def device_plan(attention: str, cfg: Optional[NSAConfig], opts: Optional[VerifyOptions], n: int, cache: KVCache,
                n_heads: int, kernels: bool):
    """The plan of one bucket (N new tokens) of the device round."""
    if not kernels:
        return RefDevicePlan(attention, cfg, opts)
    if attention == "dense":
        return KernelDensePlan()
    return KernelNSAPlan(cfg, opts, n, cache, n_heads)
