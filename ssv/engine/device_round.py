"""The device-resident decode round: AR steps and speculative rounds as fixed-shape device work,
CUDA-graphed per bucket (vLLM/SGLang style), one device-to-host read per round.

`DeviceEngine` owns the static state of a target Runner (and a drafter): the round's input token,
its output record and one captured graph per bucket, keyed by what changes the shapes (the tree
spec, traversal and verify options), never by the context length. A round is plain functions:
draft (`grow_flat` over the drafter), verify (one target pass), accept (`accept_greedy_round`),
commit (KV compaction and compressed blocks on the device, the drafter's rows likewise). The CPU
runs the same code uncaptured.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Optional

import torch

from ssv.engine.buckets import Buckets, sample_bounds, sampling_key
from ssv.engine.modes import decoding
from ssv.engine.row_ring import RowRing
from ssv.engine.runner import Runner
from ssv.engine.graphs import PhaseGraphs
from ssv.engine.prefill import PREFILL_CHUNK, DevicePrefill  # noqa: F401 -- PREFILL_CHUNK: the engine's API
from ssv.spec.accept import DeviceSampling, probs_unchecked
from ssv.spec.device import check_spec, grow_flat
from ssv.spec.device_accept import accept_greedy_round, accept_sample_round, sample_ar_token, sample_device
from ssv.spec.lookup import grow_with_chain


class DeviceEngine(Buckets, PhaseGraphs, DevicePrefill):
    def __init__(self, runner: Runner, drafter=None, graphs: Optional[bool] = None, check_sync: bool = False,
                 overlap: Optional[bool] = None, max_buckets: int = 32):
        """graphs: capture CUDA graphs (default: on CUDA). check_sync: run every eager round under the
        host-sync guard (a debugging aid, like CUDA_LAUNCH_BLOCKING; the first warm-up before a
        capture always runs under it). overlap: the generation loops launch a step before they read
        the one before it (default: on CUDA; on the CPU a step runs as it is launched, so launching
        ahead only wastes the step after a stop token). max_buckets: the speculative buckets kept (their
        graphs, plans and hand-over tensors, ~10 MB of logits alone at the default tree); the least
        recently used goes when a new one would pass it, so a long-lived engine (`ssv.LLM`) given ever
        new tree shapes stays bounded."""
        if not isinstance(max_buckets, int) or max_buckets < 1:
            raise ValueError(f"max_buckets must be an int >= 1, got {max_buckets!r}")
        self.runner, self.drafter = runner, drafter
        self.max_buckets = max_buckets
        if drafter is not None and getattr(drafter, "fused", False):
            # the drafter's RoPE read from a table by position: every drafted position (a committed
            # length plus a tree's depth) is below the cache's rows, as the history buffer's
            drafter.use_rope_table(runner.cache.max_len + runner.cache.scratch + 1)
        self.check_sync = bool(check_sync)
        # the tapped layers in the drafter's input order: the target writes them side by side
        self._taps = () if drafter is None else tuple(getattr(drafter, "fc_taps", drafter.taps))
        dev = runner.device
        self.overlap = dev.type == "cuda" if overlap is None else bool(overlap)
        self.graphs = dev.type == "cuda" if graphs is None else bool(graphs)
        if self.graphs and dev.type != "cuda":
            raise ValueError("CUDA graphs need a CUDA device (use graphs=False / --eager)")
        self.tok = torch.zeros(1, dtype=torch.long, device=dev)   # the next input token / the round's root
        self.out = torch.zeros(64, dtype=torch.long, device=dev)  # [accepted n, emitted tokens...]
        # the text's tokens by position (the root at the committed length), for rounds that draft
        # from the context (SpecOptions.lookup); set by `start(history=)`
        self.hist = torch.zeros(runner.cache.max_len + runner.cache.scratch + 1, dtype=torch.long, device=dev)
        self._hist_ready = False
        # sampling: uniforms drawn into static buffers before each replay (outside the graphs, so a
        # graph is the same function of its inputs whatever the seed)
        self.gen = torch.Generator(device=dev)
        self.coin = torch.zeros(1, device=dev)
        self.sampling = DeviceSampling(dev)   # 1 / temperature and top-p, written before a sampled launch
        # the AR step's constant path, count and tree mask (made once, not launched every step)
        self._root = torch.zeros(1, dtype=torch.long, device=dev)
        self._one = torch.ones(1, dtype=torch.long, device=dev)
        self._chain1 = torch.ones(1, 1, dtype=torch.bool, device=dev)
        r = runner
        # the kernels for dense attention too (the verify kernel as flash-decoding): the reference
        # reads the length on the host, which a graph cannot
        self.kernels = r.backend == "triton" or (r.backend == "auto" and dev.type == "cuda")
        self._lookup_best = None   # the fused lookup's workspace (ssv.ops.lookup; its second kernel resets it)
        if self.kernels:
            from ssv.ops.lookup.ops import lookup_workspace
            self._lookup_best = lookup_workspace(device=dev)
        self.ring: Optional[RowRing] = None   # AR steps' drafter rows until the next round
        self._pf: Optional[dict] = None       # the prefill chunk's static tensors (`prefill`)
        self._plans: dict = {}
        self._io: OrderedDict = OrderedDict()   # per spec bucket: the static tensors its phases hand over (LRU order)
        self._graphs: dict = {}
        self._eager: set = set()       # buckets whose capture failed
        self._warm: set = set()        # buckets warmed up uncaptured (`prepare` without graphs)
        self._pool = None
        self.timing = False            # record per-phase CUDA event times (phase -> [ms, ...])
        self.phase_ms: dict = {}
        # each launched step's record is copied into one of two host slots behind its graphs, so the
        # host can read step r while step r + 1 runs (`launch_*`, `finish`); pinned on CUDA
        pin = dev.type == "cuda"
        self._rec = [torch.zeros(64, dtype=torch.long, pin_memory=pin) for _ in range(2)]
        self._slot = 0

    # ------------------------------------------------------------------ bodies (captured as graphs)
    def _ar_body(self, params=None, keep_taps: bool = False) -> None:
        cache, model = self.runner.cache, self.runner.model
        plan = self._plan(("ar",), 1)
        # the kernels read int32 positions: the length itself (no cast launch a step)
        pos = cache.dlen if self.kernels else cache.dlen.long()
        plan.plan(cache.dlen, pos, self._chain1)
        logits, taps = model(self.tok, pos, plan, cache, taps=self._taps if keep_taps else (), wide_taps=True)
        greedy = params is None or params.greedy
        written = logits.is_cuda
        if written:   # lazily, as the accept's kernels
            from ssv.ops.topk.ops import row_argmax
            # their launches write the record's token and the next input themselves: no copy launches
            nxt = (row_argmax(logits[-1:], out=self.out[1:2], out2=self.tok) if greedy else
                   sample_ar_token(logits[-1:], params, self.coin, out=self.out[1:2], out2=self.tok))
        else:
            nxt = (logits[-1].argmax().reshape(1) if greedy
                   else sample_device(probs_unchecked(logits[-1:], params)[0], self.coin))
        cache.commit_device(self._root, self._one, kernel=self.kernels, hist=self.hist, tokens=nxt)
        if keep_taps:
            self.ring.write(taps, nxt)
        self.out[:1].fill_(1)
        if not written:
            self.out[1:2] = nxt
            self.tok.copy_(nxt)

    # a speculative round is three graphs, as vLLM / SGLang capture draft and verify apart: their
    # hand-over tensors (`_io[key]`) are static, so each replay reads what the previous one wrote
    def _draft_body(self, opts, io: dict, params=None) -> None:
        cache, dr, spec = self.runner.cache, self.drafter, opts.tree
        if not opts.lookup:
            io["tree"], io["mask"], io["pos"] = grow_flat(dr.expand_rows, self.tok[0], dr.dlogp_buf, spec, opts.order,
                                                          cache.dlen, ids=dr.vocab_ids)
            return
        io["tree"], io["mask"], io["pos"] = grow_with_chain(dr.expand_rows, self.tok[0], dr.dlogp_buf, opts, cache.dlen,
                                                            self.hist, ids=dr.vocab_ids, fused=self.kernels,
                                                            best=self._lookup_best)

    def _verify_body(self, opts, io: dict, params=None) -> None:
        cache, model = self.runner.cache, self.runner.model
        T = opts.tree.total_tokens + opts.lookup
        plan = self._plan(("spec", opts.key()), T, opts.verify)
        plan.plan(cache.dlen, io["pos"], io["mask"])
        io["logits"], io["taps"] = model(io["tree"].tokens, io["pos"], plan, cache, taps=self._taps, wide_taps=True)

    def _accept_body(self, opts, io: dict, params=None) -> None:
        cache, dr, D = self.runner.cache, self.drafter, opts.max_depth
        flat = io["tree"]
        # the record (accepted count, the token after each path row) and the next root are written
        # where the host and the next round read them; greedy: by the walk's own launch
        n, nxt = self.out[0:1], self.out[1:D + 2]
        if params is None or params.greedy:
            path, rows = accept_greedy_round(flat, io["logits"], D, n, nxt, self.tok)
        else:
            _, k = sample_bounds(opts)
            path, rows = accept_sample_round(flat, io["logits"], params, io["coins"], D, k, n, nxt, self.tok)
        # the text by position gets the token after each path row (past the accepted count they land
        # beyond the text's end: never read)
        cache.commit_device(path, n, kernel=self.kernels, hist=self.hist, tokens=nxt)
        # row i of the drafter: (the target's feature at path[i], the token after it)
        dr.commit_rows(io["taps"][rows], nxt, n)

    # ------------------------------------------------------------------ graphs (ssv.engine.graphs)
    def _state(self):
        c, d = self.runner.cache, self.drafter
        parts = [c.dlen, self.tok, self.hist]
        if d is not None:
            parts += [d.dlen, d.slot_pos, d.hid_buf, d.dlogp_buf]
            parts += [t for t in (getattr(d, "k", None), getattr(d, "v", None)) if isinstance(t, torch.Tensor)]
        if self.ring is not None:
            parts += self.ring.tensors()
        return parts

    # ------------------------------------------------------------------ rounds
    @decoding
    def start(self, token: int, seed: int = 0, history=None) -> None:
        """After a host prefill: hand the committed lengths and the first token to the device; seed
        the round's coins. history: the prompt's tokens (rounds with a context lookup need them)."""
        self.runner.cache.sync_device()
        self._hist_ready = history is not None
        if history is not None:
            if len(history) != self.runner.cache.length:
                raise ValueError(f"history has {len(history)} tokens, the cache holds {self.runner.cache.length}")
            self.hist[:len(history)] = torch.as_tensor(history, dtype=torch.long)
            self.hist[len(history)] = int(token)
        if self.ring is not None:   # an earlier generation may have ended inside an AR burst
            self.ring.discard()
        self.tok.fill_(int(token))
        self.gen.manual_seed(int(seed))

    # ------------------------------------------------------------------ steps: launch, then finish
    # A step is launched (graphs replayed, its record copied to a host slot behind them) and finished
    # later (the copy waited for, the host's lengths advanced): a loop that launches step r + 1 before
    # it finishes step r keeps the GPU busy while the host reads, checks stops and decides (SGLang's
    # overlap scheduling). The device state never waits for the host: every input of a step (root
    # token, lengths, drafter rows) is on the device. At most one step may be in flight unfinished.
    def _record(self, phases, m: int, kind: str) -> dict:
        slot = self._rec[self._slot]
        self._slot ^= 1
        times = self._run(phases)
        slot[:m].copy_(self.out[:m], non_blocking=True)
        done = None
        if slot.is_pinned():
            done = torch.cuda.Event()
            done.record()
        return {"slot": slot, "m": m, "done": done, "kind": kind, "times": times}

    @decoding
    def launch_ar(self, params=None, keep_taps: bool = False, top_k: int = 8) -> dict:
        """Launch one AR step (greedy, or sampled with `params`); `finish` gives its token. keep_taps:
        the step also keeps the drafter's row (a fall-back from speculation: `catch_up` commits the
        rows before the next round); top_k: the tree's branching, for the catch-up's agreement count."""
        if keep_taps and self._ring(top_k).full:
            self.catch_up()
        if sampling_key(params) is not None:
            torch.rand(1, generator=self.gen, device=self.coin.device, out=self.coin)
        t = self._record(self._ar_phases(params, keep_taps), 2, "ar")
        if keep_taps:
            self.ring.pending += 1     # counted at launch: the next launch's `full` must see this row
            t["ring"] = True
        return t

    @decoding
    def launch_spec(self, opts, params=None) -> dict:
        """Launch one speculative round: draft, verify, accept (greedy, or lossless sampling with
        `params`), commit; `finish` gives the emitted tokens."""
        self._check_round(opts)
        self.catch_up()
        phases, io = self._spec_phases(opts, params)
        if sampling_key(params) is not None:
            torch.rand(io["coins"].shape, generator=self.gen, device=self.coin.device, out=io["coins"])
        return self._record(phases, opts.max_depth + 2, "spec")

    def _check_round(self, opts) -> None:
        """What a speculative round of these options needs, refused before any launch or capture."""
        if self.drafter is None:
            raise ValueError("a speculative round needs a drafter")
        check_spec(opts.tree)
        if opts.lookup:
            if not self._hist_ready:
                raise ValueError("a context lookup needs the prompt's tokens: start(..., history=prompt)")
            if self.graphs and not opts.spares:
                raise ValueError("a compact lookup (spares=False) verifies rows that depend on the data, which "
                                 "a CUDA graph cannot hold: use spares=True, or graphs=False")
        if opts.max_depth + 2 > self.out.numel():
            raise ValueError(f"tree depth {opts.max_depth} exceeds the round record's {self.out.numel() - 2}")

    @decoding
    def prepare(self, opts=None, params=None, ar: bool = False, keep_taps: bool = False, top_k: int = 8,
                force: bool = False) -> None:
        """Capture (or, uncaptured on CUDA, warm up) the buckets a generation is about to use, after
        `start` and before its decode clock: the kernels' compiles and the graphs' capture are paid
        here, once, not inside the first steps (vLLM captures at start-up). opts: the speculative
        round's bucket; ar: the AR step's (keep_taps, top_k: a fall-back's, with its catch-up).
        A bucket not prepared is still captured lazily at its first launch. force: warm up
        uncaptured on the CPU too (tests)."""
        if opts is not None:
            self._check_round(opts)
            self._prepare(self._spec_phases(opts, params)[0], force)
        if ar:
            if keep_taps:
                self._ring(top_k)
                self._prepare(self._catch_up_phases(), force)
            self._prepare(self._ar_phases(params, keep_taps), force)

    def finish(self, t: dict) -> list:
        """Wait for a launched step's record (its one device-to-host read); the host's lengths follow.
        Returns the emitted tokens."""
        if t["done"] is not None:
            t["done"].synchronize()
        rec = t["slot"][: t["m"]].tolist()
        for name, a, b in t["times"]:   # the step is done: so are its events
            self.phase_ms.setdefault(name, []).append(a.elapsed_time(b))
        n = rec[0]
        self.runner.cache.advance_host(n)
        if t["kind"] == "spec":
            self.drafter.advance_host(n)
        return rec[1:1 + n]

    @decoding
    def discard(self, t: dict) -> None:
        """Undo a launched step that is not wanted (a stop was found in the step before it): the
        device's lengths go back to the host's, its drafter row leaves the ring. Its writes past
        those lengths are dead; the drafter's next-root state is not restored, so a discard ends a
        generation (the next one starts with `start`)."""
        self.runner.cache.sync_device()
        if self.drafter is not None:
            self.drafter.dlen.fill_(self.drafter.length)
        if t.get("ring"):
            self.ring.pending -= 1
            self.ring.cnt.fill_(self.ring.pending)

    def ar_step(self, params=None, keep_taps: bool = False, top_k: int = 8) -> list:
        """`launch_ar` and `finish`: one AR step, its token."""
        return self.finish(self.launch_ar(params, keep_taps, top_k))

    def spec_round(self, opts, params=None) -> list:
        """`launch_spec` and `finish`: one speculative round, its emitted tokens."""
        return self.finish(self.launch_spec(opts, params))

    @decoding
    def catch_up(self) -> None:
        """Commit the AR steps' drafter rows (one batch in fixed shapes: a graph of its own on CUDA)."""
        if self.ring is None or not self.ring.pending:
            return
        self._run(self._catch_up_phases())
        self.ring.committed()

    @decoding
    def take_agreement(self):
        """The head's depth-1 hits over the rows caught up since the last call (`RowRing`), or None."""
        return None if self.ring is None else self.ring.take_agreement()
