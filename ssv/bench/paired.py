"""The `ar` baseline stepped between a speculative run's steps, so both are timed on the same machine
state round by round (`ssv bench spec --paired`).

On a shared 2-core VM the speed of one whole run against the next can drift by a third (session 28:
ar 12.8-18.9 tok/s within one benchmark); a ratio of two runs timed a minute apart then measures the
drift. Here the speculative run calls `PairedAr` after each of its steps (`generate_spec(between=)`,
whose clock leaves that time out), and `PairedAr` takes AR steps until it has as many tokens: the two
interleave at the scale of one round (~0.1 s on the CPU), and each is timed over its own steps only.
"""
from __future__ import annotations

import time

import torch

from ssv.engine.generate import ar_host_step, check_budget, pick_token
from ssv.engine.runner import Runner
from ssv.spec.accept import SamplingParams


class PairedAr:
    """`generate_ar`'s tokens (the same seed, the same draws), one step at a time. engine: a
    `DeviceEngine` over `runner` that does not overlap (each step launched and read in turn, as
    `generate_ar` runs it on the CPU); None: the host step."""

    def __init__(self, runner: Runner, prompt_ids: list, params: SamplingParams, max_new_tokens: int,
                 seed: int = 0, engine=None):
        if engine is not None and (engine.runner is not runner or engine.overlap):
            raise ValueError("PairedAr needs a non-overlapping device engine over its own runner")
        check_budget(runner, len(prompt_ids), max_new_tokens)
        self.runner, self.params, self.engine, self.max_new = runner, params, engine, max_new_tokens
        self.gen = torch.Generator().manual_seed(seed)
        runner.reset()
        logits, _ = runner.prefill(prompt_ids)
        self.token_ids = [pick_token(logits, params, self.gen)]
        if engine is not None:   # generate_ar's order of draws: the root, then the engine's seed
            engine.start(self.token_ids[0], int(torch.randint(2 ** 62, (1,), generator=self.gen)))
        self.seconds, self.steps = 0.0, 0

    def __call__(self, tokens: int) -> None:
        """Steps until this text has `tokens` tokens (or max_new_tokens, or the context's end)."""
        r = self.runner
        while (len(self.token_ids) < min(tokens, self.max_new)
               and r.length + 1 <= r.context_limit - 1):
            t = time.perf_counter()
            if self.engine is not None:
                self.token_ids.extend(self.engine.finish(self.engine.launch_ar(self.params)))
            else:
                self.token_ids.append(ar_host_step(r, self.token_ids[-1], self.params, self.gen))
            self.seconds += time.perf_counter() - t
            self.steps += 1

    @property
    def tokens_per_second(self) -> float:
        return self.steps / self.seconds if self.seconds > 0 else 0.0
