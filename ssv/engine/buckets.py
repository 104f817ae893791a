"""A `DeviceEngine`'s buckets: what keys a round's graphs (the tree's options and whether sampling filters, never
the context length), each bucket's phases as (key, body) pairs for `PhaseGraphs`, their plans and hand-over
tensors, and the least-recently-used cap on the speculative ones."""
from __future__ import annotations

import torch

from ssv.attention_device import device_plan
from ssv.engine.row_ring import RowRing


def sampling_key(params):
    """The sampling parameters' graph key (None for greedy): only whether top-p filters. Temperature and top-p
    are device scalars (`DeviceSampling`) that a graph reads, so one graph serves every setting."""
    return None if params is None or params.greedy else ("sample", params.filters)


def sample_bounds(opts) -> tuple:
    """A sampled round's (rows, most children of a node): a chain from the context (ssv.spec.lookup)
    adds its rows and may hang one child more under a node than the head's top-k (and run past the
    head's depth: `opts.max_depth`)."""
    return opts.tree.total_tokens + opts.lookup, opts.tree.top_k + int(opts.lookup > 0)


class Buckets:
    """Mixed into `DeviceEngine`, which provides runner, drafter, ring, sampling, coin, kernels, max_buckets, `_plans`,
    `_io` (an OrderedDict, least recently used first), `_graphs`, `_eager`, `_warm` and the bodies (`_ar_body`,
    `_draft_body`, `_verify_body`, `_accept_body`)."""

    def _plan(self, key, n: int, opts=None):
        if key not in self._plans:
            r = self.runner
            self._plans[key] = device_plan(r.attention, r.nsa, opts, n, r.cache, r.model.cfg.n_heads, self.kernels)
        return self._plans[key]

    def _device_params(self, params):
        """What a body reads for sampling: None (greedy), or the static buffer with params' values written."""
        return None if sampling_key(params) is None else self.sampling.view(params)

    def _ar_phases(self, params=None, keep_taps: bool = False):
        dp = self._device_params(params)
        return [(("ar", sampling_key(params), keep_taps), lambda: self._ar_body(dp, keep_taps))]

    def _catch_up_phases(self):
        k = self.ring.k
        return [(("catch-up", k), lambda: self.ring.commit_body(k))]

    def _ring(self, top_k: int) -> RowRing:
        """The AR steps' drafter rows (a fall-back's), made at the first step that keeps them; top_k:
        the tree's branching, for the catch-up's agreement count (the latest step's)."""
        if self.drafter is None:
            raise ValueError("keep_taps needs a drafter")
        if self.ring is None:
            self.ring = RowRing(self.runner, self.drafter, top_k)
        self.ring.set_k(top_k)
        return self.ring

    def _spec_phases(self, opts, params=None):
        key = (opts.key(), sampling_key(params))
        if key in self._io:
            self._io.move_to_end(key)
        else:
            while len(self._io) >= self.max_buckets:
                self._evict(next(iter(self._io)))
        io = self._io.setdefault(key, {})
        if key[1] is not None and "coins" not in io:   # a sampled round's uniforms, drawn before each replay
            T, k = sample_bounds(opts)
            io["coins"] = torch.zeros(T, k + 1, device=self.coin.device)
        dp = self._device_params(params)
        return [(("draft", key), lambda: self._draft_body(opts, io, dp)),
                (("verify", key), lambda: self._verify_body(opts, io, dp)),
                (("accept", key), lambda: self._accept_body(opts, io, dp))], io

    def _evict(self, key) -> None:
        """Drop a speculative bucket: its graphs, hand-over tensors and (when no other bucket shares its
        options) its plan. Its last replay may still run (a launched step), and its memory goes back to
        the pool that the next capture draws from: wait for it first (a new bucket captures anyway)."""
        if self.runner.device.type == "cuda":
            torch.cuda.synchronize(self.runner.device)
        del self._io[key]
        for phase in ("draft", "verify", "accept"):
            self._graphs.pop((phase, key), None)
            self._eager.discard((phase, key))
            self._warm.discard((phase, key))
        if all(k[0] != key[0] for k in self._io):
            self._plans.pop(("spec", key[0]), None)
