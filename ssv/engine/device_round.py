"""The device-resident decode round: AR steps and speculative rounds as fixed-shape device work,
CUDA-graphed per bucket (vLLM/SGLang style), one device-to-host read per round.

`DeviceEngine` owns the static state of a target Runner (and a drafter): the round's input token,
its output record and one captured graph per bucket, keyed by what changes the shapes (the tree
spec, traversal and verify options), never by the context length. A round is plain functions:
draft (`grow_tree` over the drafter), verify (one target pass), accept (`accept_greedy_device`),
commit (KV compaction and compressed blocks on the device, the drafter's rows likewise). The CPU
runs the same code uncaptured.
"""
from __future__ import annotations

import warnings
from typing import Optional

import torch

from ssv.attention_device import device_plan
from ssv.engine.runner import Runner
from ssv.spec.device import accept_greedy_device, ancestor_mask, check_spec, flatten_device, grow_tree


class DeviceEngine:
    def __init__(self, runner: Runner, drafter=None, graphs: Optional[bool] = None):
        self.runner, self.drafter = runner, drafter
        dev = runner.device
        self.graphs = dev.type == "cuda" if graphs is None else bool(graphs)
        if self.graphs and dev.type != "cuda":
            raise ValueError("CUDA graphs need a CUDA device (use graphs=False / --eager)")
        self.tok = torch.zeros(1, dtype=torch.long, device=dev)   # the next input token / the round's root
        self.out = torch.zeros(64, dtype=torch.long, device=dev)  # [accepted n, emitted tokens...]
        self._plans: dict = {}
        self._graphs: dict = {}
        self._eager: set = set()       # buckets whose capture failed
        self._pool = None
        self.launch_counts: dict = {}

    # ------------------------------------------------------------------ bodies (captured as graphs)
    def _plan(self, key, n: int, opts=None):
        if key not in self._plans:
            r = self.runner
            self._plans[key] = device_plan(r.attention, r.nsa, opts, n, r.cache, r.model.cfg.n_heads, r.uses_kernels)
        return self._plans[key]

    def _ar_body(self) -> None:
        cache, model = self.runner.cache, self.runner.model
        plan = self._plan(("ar",), 1)
        pos = cache.dlen.long()
        plan.plan(cache.dlen, pos, torch.ones(1, 1, dtype=torch.bool, device=pos.device))
        logits, _ = model(self.tok, pos, plan, cache)
        nxt = logits[-1].argmax().reshape(1)
        cache.commit_device(torch.zeros(1, dtype=torch.long, device=pos.device), torch.ones_like(nxt))
        self.out[0] = 1
        self.out[1:2] = nxt
        self.tok.copy_(nxt)

    def _spec_body(self, opts) -> None:
        cache, model, dr = self.runner.cache, self.runner.model, self.drafter
        spec, D = opts.tree, opts.tree.depth
        tree = grow_tree(dr.expand_rows, self.tok[0], dr.dlogp_buf, spec, ids=dr.vocab_ids)
        flat, _ = flatten_device(tree, opts.order, spec)
        mask = ancestor_mask(flat.parents, D)
        plan = self._plan(("spec", opts.key()), spec.total_tokens, opts.verify)
        pos = cache.dlen.long() + flat.depth
        plan.plan(cache.dlen, pos, mask)
        logits, taps = model(flat.tokens, pos, plan, cache, taps=dr.taps)
        path, n, bonus = accept_greedy_device(flat, logits, D)
        cache.commit_device(path, n)
        rows = path.clamp_min(0)
        j = torch.arange(D + 1, device=rows.device)
        # row i of the drafter: (the target's feature at path[i], the token after it): the next
        # accepted token, the bonus after the last
        nxt = torch.where(j == n - 1, bonus, flat.tokens[torch.cat([rows[1:], rows[:1]])])
        dr.commit_rows([t[rows] for t in taps], nxt, n)
        self.out[0:1] = n
        self.out[1:D + 2] = nxt
        self.tok.copy_(bonus)

    # ------------------------------------------------------------------ graphs
    def _state(self):
        c, d = self.runner.cache, self.drafter
        parts = [c.dlen, self.tok]
        if d is not None:
            parts += [d.dlen, d.slot_pos, d.hid_buf, d.dlogp_buf]
        return parts

    def _run(self, key, body) -> None:
        if not self.graphs or key in self._eager:
            body()
            return
        g = self._graphs.get(key)
        if g is None:
            g = self._capture(key, body)
            if g is None:
                body()
                return
        g.replay()

    def _capture(self, key, body):
        # warm up (compiles, occupancy lookups, allocator) on a copy of the round's state, restored
        # after: a warm-up commits like a real round
        saved = [t.clone() for t in self._state()]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        try:
            with torch.cuda.stream(side):
                for _ in range(2):
                    body()
                    for t, s in zip(self._state(), saved):
                        t.copy_(s)
            torch.cuda.current_stream().wait_stream(side)
            g = torch.cuda.CUDAGraph()
            if self._pool is None:
                self._pool = torch.cuda.graph_pool_handle()
            with torch.cuda.graph(g, pool=self._pool):
                body()
        except Exception as e:  # noqa: BLE001 -- a capture failure must cost speed, never the answer
            torch.cuda.synchronize()
            for t, s in zip(self._state(), saved):
                t.copy_(s)
            warnings.warn(f"CUDA graph capture of {key[0]} failed ({type(e).__name__}: {e}); running it eagerly")
            self._eager.add(key)
            return None
        for t, s in zip(self._state(), saved):
            t.copy_(s)
        self._graphs[key] = g
        return g

    # ------------------------------------------------------------------ rounds
    def start(self, token: int) -> None:
        """After a host prefill: hand the committed lengths and the first token to the device."""
        self.runner.cache.sync_device()
        self.tok.fill_(int(token))

    @torch.no_grad()
    def ar_step(self) -> list:
        """One AR step (greedy); returns the emitted token (the round's one device-to-host read)."""
        self._run(("ar",), self._ar_body)
        tok = int(self.out[1])
        self.runner.cache.advance_host(1)
        return [tok]

    @torch.no_grad()
    def spec_round(self, opts) -> list:
        """One speculative round (greedy): draft, verify, accept, commit; returns the emitted tokens."""
        if self.drafter is None:
            raise ValueError("a speculative round needs a drafter")
        check_spec(opts.tree)
        if opts.tree.depth + 2 > self.out.numel():
            raise ValueError(f"tree depth {opts.tree.depth} exceeds the round record's {self.out.numel() - 2}")
        self._run(("spec", opts.key()), lambda: self._spec_body(opts))
        rec = self.out[: opts.tree.depth + 2].tolist()
        n = rec[0]
        self.runner.cache.advance_host(n)
        self.drafter.advance_host(n)
        return rec[1:1 + n]
