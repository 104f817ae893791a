"""Attention plans: metadata computed once per forward step and handed to every layer.

Like FlashInfer's plan()/run(): the constructor (plan) computes visibility, groups and routing reuse
once; `run(layer, q, cache, gates)` only attends. Model files never decide how attention is computed.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from ssv.cache import KVCache
from ssv.config import NSAConfig
from ssv.ops.dense.naive import dense_naive
from ssv.ops.nsa.cpu import CpuStep, nsa_cpu
from ssv.ops.nsa.cpu import supported as cpu_supported
from ssv.ops.nsa.naive import check_visibility, nsa_naive

PRECISIONS = ("strict", "approx")


@dataclass
class StepMeta:
    """Which new tokens a step holds and what each of them sees (see ssv/ops/nsa/README.md)."""

    prefix_len: int
    positions: torch.Tensor   # [N]
    tree_mask: torch.Tensor   # [N, N] bool

    @classmethod
    def chain(cls, prefix_len: int, n: int, device="cpu") -> "StepMeta":
        pos = torch.arange(prefix_len, prefix_len + n, device=device)
        mask = torch.ones(n, n, dtype=torch.bool, device=device).tril()
        return cls(prefix_len, pos, mask)

    @property
    def n(self) -> int:
        return int(self.positions.numel())


class _HostSlots:
    """The step's new keys/values go to the cache's slots after its host-side length."""

    def slots(self, cache: KVCache, n: int) -> torch.Tensor:
        """The step's cache slots [N] for the fused cache write (after the host length; made once)."""
        cache.check_room(n)
        hit = self.__dict__.get("_slots")
        if hit is None or hit.numel() != n:
            hit = self._slots = torch.arange(cache.length, cache.length + n, device=cache.k.device)
        return hit


class DensePlan(_HostSlots):
    def __init__(self, meta: StepMeta, check: bool = True):
        if check:
            check_visibility(meta.prefix_len, meta.positions.cpu(), meta.tree_mask.cpu())
        self.meta = meta

    def run(self, layer: int, q: torch.Tensor, cache: KVCache, gates=None) -> torch.Tensor:
        m = self.meta
        return dense_naive(q, cache.k[layer], cache.v[layer], m.prefix_len, m.positions, m.tree_mask,
                           check=False).to(q.dtype)


@dataclass
class VerifyOptions:
    """How a verification step may share work between queries (the kernels' knobs).

    group_size C: consecutive queries (in the tree's flattened order) that form one group.
    precision: "strict" keeps each query's own selection; "approx" gives a group its first query's.
    refresh: per layer, True = recompute routing, False = reuse the last refresh layer's selection
             (None = refresh every layer). Layer 0 must refresh.
    """

    group_size: int = 1
    precision: str = "strict"
    refresh: Optional[tuple] = None

    def __post_init__(self):
        if self.group_size not in (1, 2, 4, 8, 16):
            raise ValueError(f"group size must be one of 1, 2, 4, 8, 16, got {self.group_size}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {self.precision!r}")
        if self.refresh is not None and (len(self.refresh) == 0 or not self.refresh[0]):
            raise ValueError("refresh schedule must start with a refresh layer")

    @staticmethod
    def every(k: int, n_layers: int) -> Optional[tuple]:
        """The refresh schedule "routing at every k-th layer" (None when k = 1: every layer)."""
        if not isinstance(k, int) or k < 1:
            raise ValueError(f"refresh period must be an int >= 1, got {k!r}")
        return None if k == 1 else tuple(i % k == 0 for i in range(n_layers))

    def refreshes(self, layer: int) -> bool:
        """Whether `layer` recomputes routing (the schedule repeats past its length)."""
        return self.refresh is None or bool(self.refresh[layer % len(self.refresh)])


class NSAPlan(_HostSlots):
    """NSA on the reference ops (the CPU path); records routing when asked. On the CPU the "union" and
    "gated" gatings run `nsa_cpu`, the reference's math with the step's masks built once (AR steps,
    verification and prefill alike, so strict verification still agrees with AR decoding)."""

    def __init__(self, meta: StepMeta, cfg: NSAConfig, opts: Optional[VerifyOptions] = None,
                 record: Optional[list] = None):
        check_visibility(meta.prefix_len, meta.positions.cpu(), meta.tree_mask.cpu())
        self.meta, self.cfg, self.opts = meta, cfg, opts or VerifyOptions()
        self.record = record
        self._indices: Optional[torch.Tensor] = None  # routing of the last refresh layer
        rep = torch.arange(meta.n) // self.opts.group_size * self.opts.group_size
        self._rep = rep.to(meta.positions.device)      # each query's group representative
        self._step = None
        if cpu_supported(cfg, meta.positions.device) and meta.n:
            self._step = CpuStep(meta.prefix_len, meta.positions, meta.tree_mask, cfg)

    def run(self, layer: int, q: torch.Tensor, cache: KVCache, gates=None) -> torch.Tensor:
        m = self.meta
        kc = cache.k_cmp[layer] if _same_blocks(cache.nsa, self.cfg) else None
        vc = cache.v_cmp[layer] if kc is not None else None
        if self._step is not None:
            return self._run_cpu(layer, q, cache, gates, kc, vc)
        kw = dict(gates=gates, k_cmp=kc, v_cmp=vc)
        reuse = None if self.opts.refreshes(layer) else self._indices
        out = nsa_naive(q, cache.k[layer], cache.v[layer], m.prefix_len, m.positions, m.tree_mask, self.cfg,
                        block_indices=reuse, **kw)
        idx = out.block_indices
        if reuse is None and self.opts.precision == "approx" and self.opts.group_size > 1:
            idx = idx[self._rep]
            out = nsa_naive(q, cache.k[layer], cache.v[layer], m.prefix_len, m.positions, m.tree_mask,
                            self.cfg, block_indices=idx, **kw)
        if reuse is None:
            self._indices = idx
        if self.record is not None:
            self.record.append(_record(layer, m, idx))
        return out.o.to(q.dtype)

    def _run_cpu(self, layer, q, cache, gates, kc, vc) -> torch.Tensor:
        reuse = None if self.opts.refreshes(layer) else self._indices
        k, v = cache.k[layer], cache.v[layer]
        o, idx = nsa_cpu(q, k, v, self._step, kc, vc, gates=gates, block_indices=reuse)
        if reuse is None and self.opts.precision == "approx" and self.opts.group_size > 1:
            idx = idx[self._rep]
            o, _ = nsa_cpu(q, k, v, self._step, kc, vc, gates=gates, block_indices=idx)
        if reuse is None:
            self._indices = idx
        if self.record is not None:
            self.record.append(_record(layer, self.meta, idx))
        return o.to(q.dtype)


class TritonNSAPlan(_HostSlots):
    """NSA on the Triton kernels: routing at refresh layers, one grouped verify launch per layer.

    Plan (once per step): path-specific compression weights and the tree mask. Run (per layer): at a
    refresh layer, routing (the path-specific blocks scored inside it); then the SSV kernel over the
    group's union of blocks.
    """

    def __init__(self, meta: StepMeta, cfg: NSAConfig, opts: Optional[VerifyOptions] = None,
                 record: Optional[list] = None):
        from ssv.ops.nsa.route import path_block_weights
        if cfg.gating == "union_cmp":
            raise ValueError("the Triton kernels implement gatings 'union' and 'gated', not 'union_cmp'")
        self.meta, self.cfg, self.opts, self.record = meta, cfg, opts or VerifyOptions(), record
        self.w, self.s0, self.n_path = path_block_weights(meta.prefix_len, meta.positions, meta.tree_mask, cfg)
        self.tmask = meta.tree_mask.to(torch.uint8).contiguous()
        self.max_pos = int(meta.positions.max())  # the step's one host sync
        self._indices: Optional[torch.Tensor] = None
        self._counters: Optional[torch.Tensor] = None

    def run(self, layer: int, q: torch.Tensor, cache: KVCache, gates=None) -> torch.Tensor:
        from ssv.ops.nsa.naive import num_cmp_blocks
        from ssv.ops.nsa.route import nsa_route
        from ssv.ops.nsa.verify import nsa_verify, num_counters
        m, cfg, opts = self.meta, self.cfg, self.opts
        k, v = cache.k[layer], cache.v[layer]
        gated = cfg.gating == "gated"
        refresh = opts.refreshes(layer) or self._indices is None
        o_cmp = None
        if refresh or gated:
            if not _same_blocks(cache.nsa, cfg) or cache.k_cmp.shape[2] == 0:
                raise ValueError("the cache keeps no compressed blocks for this NSA configuration")
            idx, _, _, o_cmp = nsa_route(q, cache.k_cmp[layer], cache.v_cmp[layer],
                                         num_cmp_blocks(m.prefix_len, cfg), k, v, self.w, self.s0, self.n_path,
                                         m.positions, cfg, want_o=gated, max_pos=self.max_pos)
            if refresh:
                self._indices = idx
                if self.record is not None:
                    self.record.append(_record(layer, m, idx))
        if self._counters is None:  # a folded merge's counters: zeroed once, left zero by every layer
            self._counters = torch.zeros(num_counters(m.n, q.shape[1], k.shape[0], opts.group_size),
                                         device=q.device, dtype=torch.int32)
        o, _, _ = nsa_verify(q, k, v, m.prefix_len, m.positions, self.tmask, self._indices, cfg.slc_block,
                             cfg.window, opts.group_size, opts.precision == "approx", gates, o_cmp,
                             counters=self._counters)
        return o


def _record(layer: int, m: StepMeta, idx: torch.Tensor) -> dict:
    """One routing record (ssv generate --record-routing): enough to replay the step's kernel inputs."""
    return {"layer": layer, "prefix_len": m.prefix_len, "positions": m.positions.cpu(),
            "tree_mask": m.tree_mask.cpu(), "block_indices": idx.cpu()}


def _same_blocks(a: Optional[NSAConfig], b: NSAConfig) -> bool:
    return a is not None and (a.cmp_block, a.cmp_stride) == (b.cmp_block, b.cmp_stride)
