"""Speculative decoding as plain functions over a target Runner and a drafter: draft, verify, accept, commit.

One round: the drafter grows a tree under the current root (the last emitted token, not yet in the
target's cache); the tree is flattened in the chosen traversal order; the target verifies every node
in one pass (exact NSA semantics per node, routed through the plan's grouped kernels on CUDA); the
longest accepted root-to-node path is compacted into the cache and re-run through the drafter; the
bonus token becomes the next root.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

from ssv.attention import StepMeta, VerifyOptions
from ssv.engine.generate import GenResult, _sync, check_budget, pick_token, prefill_of
from ssv.engine.modes import decoding
from ssv.engine.runner import Runner
from ssv.spec.accept import SamplingParams, accept_greedy, accept_sample, draw_coins
from ssv.spec.lookup import attach_chain, context_lookup
from ssv.spec.flatten import flatten, tree_metadata
from ssv.spec.tree import ORDERS, DraftTree, TreeSpec


@dataclass
class SpecOptions:
    tree: TreeSpec = field(default_factory=lambda: TreeSpec(depth=6, top_k=8, total_tokens=48))
    order: str = "pos"
    verify: VerifyOptions = field(default_factory=VerifyOptions)
    # a chain of up to `lookup` tokens drafted from the context beside the head's tree (greedy and
    # sampled rounds; ssv.spec.lookup). spares: the head grows `lookup` nodes more, which verify where the
    # chain does not need them (fixed rows: a graphed round's); off, a round verifies the head's tree
    # and the chain's new tokens only (the CPU's: a row costs there, and nothing is captured)
    lookup: int = 0
    spares: bool = True

    def __post_init__(self):
        if self.order not in ORDERS:
            raise ValueError(f"traversal must be one of {ORDERS}, got {self.order!r}")
        if not isinstance(self.lookup, int) or not 0 <= self.lookup <= 16:
            raise ValueError(f"lookup must be an int in [0, 16], got {self.lookup!r}")
        if self.tree.total_tokens + self.lookup > 128:
            raise ValueError(f"at most 128 tree tokens are verified at once, got {self.tree.total_tokens}"
                             + (f" + {self.lookup} looked up" if self.lookup else ""))
        if self.spares and self.tree.total_tokens + self.lookup > self.tree.max_nodes:
            raise ValueError(f"a lookup of {self.lookup} takes the place of the head's spare nodes: a tree of "
                             f"{self.tree.total_tokens} + {self.lookup} needs a larger pool than depth "
                             f"{self.tree.depth} and top-k {self.tree.top_k} grow ({self.tree.max_nodes} nodes)")
        if self.verify.refresh is not None and self.verify.precision == "strict":
            raise ValueError("reusing routing across layers changes NSA's output: it needs --precision approx")

    def key(self) -> tuple:
        """What fixes a round's shapes and launches (its graph bucket)."""
        t, v = self.tree, self.verify
        return (t.depth, t.top_k, t.total_tokens, self.order, v.group_size, v.precision, v.refresh, self.lookup,
                self.spares)

    @property
    def max_depth(self) -> int:
        """The longest path a round can accept (the head's levels, or the looked-up chain)."""
        return max(self.tree.depth, self.lookup)


def draft(drafter, root: int, root_logp: torch.Tensor, opts: SpecOptions, chain=None) -> tuple:
    """Grow and flatten a tree. chain (a round with opts.lookup = K; tokens after the root,
    `ssv.spec.lookup`): the head grows K nodes more and the chain takes the place of as many of its
    lowest-ranked ones as it needs. Returns (tree in traversal order, perm)."""
    if chain is None or not opts.spares:
        tree = drafter.propose(root, root_logp, opts.tree)
        return flatten(tree if chain is None else attach_chain(tree, list(chain), 0), opts.order)
    t = opts.tree
    tree = drafter.propose(root, root_logp, TreeSpec(t.depth, t.top_k, t.total_tokens + opts.lookup))
    return flatten(attach_chain(tree, list(chain), opts.lookup), opts.order)


def verify(runner: Runner, tree: DraftTree, opts: SpecOptions, taps=()):
    """One target pass over every node: logits [N, V] and tapped hidden states of every node."""
    tm = tree_metadata(tree, runner.length)
    meta = StepMeta(runner.length, tm.positions, tm.mask)
    return runner.forward(tree.tokens, meta, opts.verify, taps=taps)


def accept(tree: DraftTree, logits: torch.Tensor, params: SamplingParams, gen: torch.Generator):
    logits = logits.float().cpu()
    if params.greedy:
        return accept_greedy(tree, logits)
    return accept_sample(tree, logits, params, draw_coins(tree, gen))


def commit(runner: Runner, drafter, res, taps) -> torch.Tensor:
    """Compact the accepted path into the target cache and feed it (with the bonus) to the drafter."""
    runner.cache.commit_path(res.path)
    idx = torch.tensor(res.path, device=taps[0].device)
    return drafter.commit([t[idx] for t in taps], torch.tensor(res.tokens + [res.bonus]))


def _ar_keep(runner: Runner, drafter, root: int, params: SamplingParams, gen: torch.Generator, held: list) -> list:
    """A host AR step of the fall-back that keeps the drafter's row (its taps, the token after)."""
    logits, taps = runner.forward(torch.tensor([root]), StepMeta.chain(runner.length, 1), taps=drafter.taps)
    runner.cache.commit(1)
    nxt = pick_token(logits[-1], params, gen)
    held.append((taps, nxt))
    return [nxt]


@decoding
def generate_spec(runner: Runner, drafter, prompt_ids: list, params: SamplingParams, max_new_tokens: int,
                  opts: Optional[SpecOptions] = None, seed: int = 0, stop_ids=(), progress: bool = False,
                  planner=None, engine=None, fallback=None, round_seconds: Optional[list] = None,
                  between: Optional[Callable[[int], None]] = None) -> GenResult:
    """planner (ssv.spec.planner.AdaptivePlanner): chooses the options of every round instead of `opts`.
    fallback (ssv.spec.fallback.ArFallback): AR steps instead of rounds while speculation does not pay
    (the same tokens: strict rounds and AR steps agree; the drafter is caught up before a round).
    engine (ssv.engine.device_round.DeviceEngine over this runner and drafter): rounds run
    device-resident (graphed on CUDA), greedy or sampled (coins from the engine's generator, seeded
    with `seed`: the same distribution as the host round, not the same draws).
    round_seconds: a list that gets each speculative round's wall time (a benchmark's switch costs).
    between(tokens so far): called after every step, its time left out of every time measured here (a
    benchmark steps its paired baseline there, `ssv.bench.paired`); not with an overlapping engine,
    whose next step would run during it."""
    if opts is None and planner is None:
        raise ValueError("generate_spec needs SpecOptions or a planner")
    if between is not None and engine is not None and engine.overlap:
        raise ValueError("between needs a non-overlapping engine: the step in flight would run during it")
    paused = [0.0]
    clock = lambda: time.perf_counter() - paused[0]  # noqa: E731 -- wall time without `between`'s
    check_budget(runner, len(prompt_ids), max_new_tokens)
    if planner is not None:
        planner.reset()
    if fallback is not None:
        fallback.reset()
    gen = torch.Generator().manual_seed(seed)
    fast = engine is not None
    if fast and (engine.runner is not runner or engine.drafter is not drafter):
        raise ValueError("the device engine belongs to another runner or drafter")
    runner.reset()
    drafter.reset()
    _sync(runner.device)
    t0 = time.perf_counter()
    logits, chunks = prefill_of(runner, engine)(prompt_ids, progress=progress, taps=drafter.taps)
    root = pick_token(logits, params, gen)
    taps = [torch.cat([c[i] for c in chunks]) for i in range(len(drafter.taps))]
    # with a fall-back, the head's agreement with the prompt's last rows decides the first step
    # (a planner's strategies differ per round: no single tree to estimate for)
    prime = fallback is not None and opts is not None and fallback.prime_rows > 0 and hasattr(drafter, "agreement")
    agree = {"agree": (opts.tree.top_k, fallback.prime_rows + 1)} if prime else {}
    root_logp = drafter.commit(taps, torch.tensor(prompt_ids[1:] + [root]), **agree)
    if fast:
        # the engine's coins from a seed the host generator draws: never the host's own stream
        engine.start(root, int(torch.randint(2 ** 62, (1,), generator=gen)), history=prompt_ids)
    if prime and drafter.agreement is not None:
        fallback.prime(*drafter.agreement, opts.tree.depth)
    _sync(runner.device)
    t_setup = time.perf_counter()
    if fast and planner is None:   # compiles and capture before the decode clock (reported apart);
        # a planner's buckets are captured at their first round
        engine.prepare(opts, params, ar=fallback is not None, keep_taps=True, top_k=opts.tree.top_k)
        _sync(runner.device)
    t1 = time.perf_counter()
    out, stop = [root], "length"
    # the host round's text by position for a context lookup, filled as tokens are emitted
    P, written = len(prompt_ids), 0
    hist = None
    n = {"rounds": 0, "ar": 0}
    held = []   # the host fall-back's AR rows owed to the drafter
    depth_hits = [0] * ((opts.max_depth if opts is not None else 0) + 1)

    def settle(kind: str, new: list, dt: float, o: SpecOptions):
        """A finished step's tokens into `out` and the policies; "eos" when it ended the text."""
        if kind == "ar":
            fallback.observe_ar(dt)
            agree = engine.take_agreement() if fast else None
            if agree is not None:
                fallback.observe_agreement(*agree, o.tree.depth)
            n["ar"] += 1
            out.append(new[0])
        else:
            n["rounds"] += 1
            if round_seconds is not None:
                round_seconds.append(dt)
            if fallback is not None:
                fallback.observe_spec(len(new), dt)
            if planner is not None:
                planner.observe(len(new))
            # the spec's depth, or more: a drafter may exceed it
            depth_hits.extend([0] * (max(len(new), o.max_depth + 1) - len(depth_hits)))
            for d in range(1, len(new)):
                depth_hits[d] += 1
            for t in new:
                out.append(t)
                if t in stop_ids or len(out) >= max_new_tokens:
                    break
        if between is not None:
            t = time.perf_counter()
            between(len(out))
            paused[0] += time.perf_counter() - t
        return "eos" if out[-1] in stop_ids else None

    def decide(o: SpecOptions) -> bool:
        """Whether the next step is an AR step of the fall-back (a burst's end judged first)."""
        if fallback is None:
            return False
        if fallback.check_due:   # a burst ended: extend it on the drafts' evidence?
            if fast:
                engine.catch_up()
            fallback.burst_end(engine.take_agreement() if fast else None, o.tree.depth)
        return fallback.use_ar()

    if root in stop_ids:
        stop = "eos"
    elif fast:
        stop = _device_steps(engine, runner, opts, planner, params, out, max_new_tokens, decide, settle, clock)
    while stop == "length" and not fast:
        if len(out) >= max_new_tokens:
            break
        if planner is not None:
            opts = planner.choose(runner.length)
        if runner.length + opts.max_depth + 2 > runner.context_limit:
            stop = "context"
            break
        ar = decide(opts)
        t_round = clock()
        if ar:
            new = _ar_keep(runner, drafter, out[-1], params, gen, held)
        else:
            if held:
                root_logp = drafter.commit([torch.cat(t) for t in zip(*[h[0] for h in held])],
                                           torch.tensor([h[1] for h in held]))
                held.clear()
            chain = None   # sampled rounds too: a looked-up token is one more deterministic candidate (ssv.spec.accept)
            if opts.lookup:
                if hist is None:
                    hist = torch.tensor(prompt_ids + [0] * (max_new_tokens + 1))
                hist[P + written:P + len(out)] = torch.tensor(out[written:])   # the tokens since the last round
                written = len(out)
                toks, valid = context_lookup(hist, P + written, opts.lookup)
                chain = toks[valid].tolist()
            tree, _ = draft(drafter, out[-1], root_logp, opts, chain)
            logits, taps = verify(runner, tree, opts, taps=drafter.taps)
            res = accept(tree, logits, params, gen)
            root_logp = commit(runner, drafter, res, taps)
            new = res.tokens + [res.bonus]
        stop = settle("ar" if ar else "spec", new, clock() - t_round, opts) or stop
    _sync(runner.device)
    t2 = clock()
    dec = t2 - t1
    emitted = len(out) - 1
    rounds, ar_steps = n["rounds"], n["ar"]
    spec_tokens = emitted - ar_steps
    stats = {"prompt_tokens": len(prompt_ids), "new_tokens": len(out), "prefill_seconds": t_setup - t0,
             "setup_seconds": t1 - t_setup, "decode_seconds": dec, "rounds": rounds, "ar_steps": ar_steps,
             "tokens_per_second": emitted / dec if dec > 0 and emitted else 0.0,
             "mean_accepted_length": spec_tokens / rounds if rounds else 0.0,
             "acceptance_by_depth": [h / rounds if rounds else 0.0 for h in depth_hits[1:]], "stop": stop}
    if fallback is not None:
        stats["fallback"] = fallback.summary()
    if planner is None:
        stats.update(tree=vars(opts.tree), traversal=opts.order, group_size=opts.verify.group_size,
                     precision=opts.verify.precision, lookup=opts.lookup, spares=opts.spares)
    else:  # the strategies per round are in the planner's summary
        stats.update(tree="adaptive", traversal="adaptive", group_size="adaptive",
                     precision="approx" if planner.used_approx else "strict", planner=planner.summary())
    return GenResult(out, stats)


def _device_steps(engine, runner: Runner, opts, planner, params, out: list, max_new_tokens: int, decide, settle,
                  clock=time.perf_counter) -> str:
    """`generate_spec`'s steps on the device engine, each launched before the one in flight is
    finished (the host's read, stop checks and policies overlap the next step; the policies see
    each step one step late). A step is launched only when the text surely needs it, unless the
    step in flight ends it with a stop token: then it is discarded. Returns the stop reason."""
    flight, t_mark = None, 0.0
    while True:
        if planner is not None:
            opts = planner.choose(runner.length)
        ahead = flight["most"] if flight is not None else 0   # tokens the step in flight may add
        nxt = None
        if ((flight is None or engine.overlap) and len(out) + ahead < max_new_tokens
                and runner.length + ahead + opts.max_depth + 2 <= runner.context_limit):
            if flight is None:
                t_mark = clock()
            if decide(opts):
                nxt = engine.launch_ar(params, keep_taps=True, top_k=opts.tree.top_k)
                nxt["most"] = 1
            else:
                nxt = engine.launch_spec(opts, params)
                nxt["most"] = opts.max_depth + 1
            nxt["opts"] = opts
        elif flight is None:
            return "length" if len(out) >= max_new_tokens else "context"
        if flight is not None:
            new = engine.finish(flight)
            now = clock()
            reason = settle(flight["kind"], new, now - t_mark, flight["opts"])
            t_mark = now
            if reason is not None:
                if nxt is not None:
                    engine.discard(nxt)
                return reason
        flight = nxt
