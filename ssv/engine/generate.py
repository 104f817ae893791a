"""Autoregressive decoding and perplexity over a Runner."""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch

from ssv.attention import StepMeta
from ssv.engine.modes import decoding
from ssv.engine.runner import Runner
from ssv.spec.accept import SamplingParams, sample_from, target_probs


@dataclass
class GenResult:
    token_ids: list
    stats: dict = field(default_factory=dict)


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def pick_token(logits: torch.Tensor, params: SamplingParams, gen: torch.Generator) -> int:
    """Greedy at temperature 0 (ties: lowest id), else inverse-CDF sampling of the processed target."""
    if params.temperature == 0:
        return int(torch.argmax(logits))
    coin = float(torch.rand((), generator=gen))
    return sample_from(target_probs(logits[None].float().cpu(), params)[0], coin)


def check_budget(runner: Runner, n_prompt: int, max_new_tokens: int) -> None:
    if n_prompt == 0:
        raise ValueError("empty prompt: give at least one token")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if n_prompt >= runner.context_limit:
        raise ValueError(f"prompt of {n_prompt} tokens leaves no room in the context limit of "
                         f"{runner.context_limit} tokens")


def ar_host_step(runner: Runner, token: int, params: SamplingParams, gen: torch.Generator, see=None) -> int:
    """One AR step on the host: `token` forwarded and committed; the next token picked (its logits
    shown to `see` first, if given)."""
    logits, _ = runner.forward(torch.tensor([token]), StepMeta.chain(runner.length, 1))
    runner.cache.commit(1)
    last = logits[-1]
    return pick_token(see(last) if see is not None else last, params, gen)


def prefill_of(runner: Runner, engine=None):
    """The prompt's prefill: on CUDA the engine's chunks (`DeviceEngine.prefill`: graphed, or the same
    code uncaptured with graphs off, so that graphs on and off compute alike), else the runner's (the
    CPU keeps its own chunked path, `ssv.ops.nsa.cpu`)."""
    from ssv.engine.prefill import PREFILL_CHUNK
    chunks = engine is not None and runner.device.type == "cuda" and runner.cache.scratch >= PREFILL_CHUNK
    return engine.prefill if chunks else runner.prefill


@decoding
def generate_ar(runner: Runner, prompt_ids: list, params: SamplingParams, max_new_tokens: int,
                seed: int = 0, stop_ids=(), progress: bool = False, margins: bool = False,
                engine=None) -> GenResult:
    """Plain autoregressive decoding: the 1.00x baseline and the ground truth for speculative modes.

    margins: also record, for every generated token, the top-2 margin of the logits that picked it
    (stats["top2_margins"]): how close each greedy choice was to a tie (host steps only).
    engine (ssv.engine.device_round.DeviceEngine over this runner): the steps run device-resident
    (graphed on CUDA), greedy or sampled; margins keep the host step."""
    check_budget(runner, len(prompt_ids), max_new_tokens)
    fast = engine is not None and not margins
    if fast and engine.runner is not runner:
        raise ValueError("the device engine belongs to another runner")
    gen = torch.Generator().manual_seed(seed)
    runner.reset()
    _sync(runner.device)
    t0 = time.perf_counter()
    logits, _ = prefill_of(runner, engine if fast else None)(prompt_ids, progress=progress)
    gaps = []

    def gap(lg):
        if margins:
            top = lg.float().reshape(-1).topk(2).values
            gaps.append(float(top[0] - top[1]))
        return lg
    out = [pick_token(gap(logits), params, gen)]
    if fast:
        # the engine's coins from a seed the host generator draws: never the host's own stream
        engine.start(out[0], int(torch.randint(2 ** 62, (1,), generator=gen)))
    _sync(runner.device)
    t_setup = time.perf_counter()
    if fast:   # compiles and capture before the decode clock (reported apart)
        engine.prepare(params=params, ar=True)
        _sync(runner.device)
    t1 = time.perf_counter()
    rounds, stop = 0, "length"
    while True:
        if out[-1] in stop_ids:
            stop = "eos"
            break
        if len(out) >= max_new_tokens:
            break
        if runner.length + 1 > runner.context_limit - 1:
            stop = "context"
            break
        if fast:
            rounds, stop = _ar_device_steps(engine, runner, out, params, max_new_tokens, stop_ids)
            break
        rounds += 1
        out.append(ar_host_step(runner, out[-1], params, gen, gap))
    _sync(runner.device)
    t2 = time.perf_counter()
    dec = t2 - t1
    stats = {"prompt_tokens": len(prompt_ids), "new_tokens": len(out), "prefill_seconds": t_setup - t0,
             "setup_seconds": t1 - t_setup, "decode_seconds": dec, "rounds": rounds,
             "tokens_per_second": (len(out) - 1) / dec if dec > 0 and len(out) > 1 else 0.0,
             "mean_accepted_length": 1.0, "stop": stop}
    if margins:
        stats["top2_margins"] = gaps
    return GenResult(out, stats)


def _ar_device_steps(engine, runner: Runner, out: list, params, max_new_tokens: int, stop_ids) -> tuple:
    """The device AR steps of `generate_ar`, each launched before the one in flight is finished (the
    host's read and checks overlap the next step); a step launched past an end-of-sequence token is
    discarded. Returns (steps, stop reason)."""
    steps, flight = 0, None
    while True:
        ahead = int(flight is not None)   # tokens the step in flight will add
        if ((flight is None or engine.overlap) and len(out) + ahead < max_new_tokens
                and runner.length + ahead + 1 <= runner.context_limit - 1):
            nxt = engine.launch_ar(params)
        elif flight is None:
            return steps, ("length" if len(out) >= max_new_tokens else "context")
        else:
            nxt = None
        if flight is not None:
            out.extend(engine.finish(flight))
            steps += 1
            if out[-1] in stop_ids:
                if nxt is not None:
                    engine.discard(nxt)
                return steps, "eos"
        flight = nxt


@decoding
def perplexity(runner: Runner, ids: list, score_from: int, chunk: int = 256, progress: bool = False) -> dict:
    """exp(mean NLL) of tokens at positions >= score_from, each predicted from everything before it."""
    if len(ids) < 2:
        raise ValueError("perplexity needs at least 2 tokens")
    if len(ids) > runner.context_limit:
        raise ValueError(f"{len(ids)} tokens exceed the context limit of {runner.context_limit}")
    if not 1 <= score_from < len(ids):
        raise ValueError(f"score_from must be in [1, {len(ids) - 1}], got {score_from}")
    from tqdm import tqdm
    runner.reset()
    nll, count = 0.0, 0
    t = torch.tensor(ids, dtype=torch.long)
    for c0 in tqdm(range(0, len(ids) - 1, chunk), desc="ppl", disable=not progress, leave=False):
        part = t[c0:min(len(ids) - 1, c0 + chunk)]
        logits, _ = runner.forward(part, StepMeta.chain(runner.length, part.numel()))
        runner.cache.commit(part.numel())
        tgt_pos = torch.arange(c0 + 1, c0 + 1 + part.numel())
        keep = tgt_pos >= score_from
        if keep.any():
            lp = torch.log_softmax(logits.float().cpu(), -1)[keep]
            nll -= float(lp.gather(1, t[tgt_pos[keep]][:, None]).sum())
            count += int(keep.sum())
    return {"perplexity": math.exp(nll / count), "tokens": count, "context": len(ids), "score_from": score_from}
