"""`ssv bench spec --paired`: the ar baseline stepped between a speculative run's steps."""
import time

import pytest
import torch

from ssv.bench.paired import PairedAr
from ssv.bench.spec import eval_spec, summarize
from ssv.draft import Eagle3Drafter
from ssv.engine.device_round import DeviceEngine
from ssv.engine.generate import generate_ar
from ssv.engine.runner import Runner
from ssv.engine.spec import SpecOptions, generate_spec
from ssv.spec.accept import SamplingParams
from ssv.spec.tree import TreeSpec

from .draft.helpers import tiny_head, tiny_target
from .engine.test_spec import NSA

OPTS = SpecOptions(tree=TreeSpec(3, 2, 6))


@pytest.fixture(scope="module")
def models():
    target = tiny_target()
    return target, Eagle3Drafter(tiny_head(target, draft_vocab=40, window=64), target)


def prompt(seed, n=37):
    return torch.randint(0, 60, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.mark.parametrize("temperature", [0.0, 0.8])
@pytest.mark.parametrize("device", [False, True])
def test_paired_ar_steps_give_generate_ars_tokens(models, temperature, device):
    target, _ = models
    ids, sp = prompt(1), SamplingParams(temperature=temperature)
    r = Runner(target, attention="nsa", nsa=NSA)
    want = generate_ar(r, ids, sp, 11, seed=5, engine=DeviceEngine(r, overlap=False) if device else None)
    r2 = Runner(target, attention="nsa", nsa=NSA)
    pair = PairedAr(r2, ids, sp, 11, seed=5, engine=DeviceEngine(r2, overlap=False) if device else None)
    pair(4)
    assert (len(pair.token_ids), pair.steps) == (4, 3)
    pair(3)                                      # behind already: no step
    assert pair.steps == 3
    pair(50)                                     # never past max_new_tokens
    assert pair.token_ids == want.token_ids and pair.steps == 10 and pair.tokens_per_second > 0


def test_paired_ar_refuses_an_overlapping_or_foreign_engine(models):
    target, _ = models
    r, other = Runner(target, attention="nsa", nsa=NSA), Runner(target, attention="nsa", nsa=NSA)
    for eng in (DeviceEngine(r, overlap=True), DeviceEngine(other, overlap=False)):
        with pytest.raises(ValueError, match="non-overlapping device engine over its own runner"):
            PairedAr(r, prompt(2), SamplingParams(), 8, engine=eng)
    with pytest.raises(ValueError, match="empty prompt"):
        PairedAr(r, [], SamplingParams(), 8)


@pytest.mark.parametrize("device", [False, True])
def test_between_runs_after_every_step_and_its_time_is_left_out(models, device):
    target, drafter = models
    ids, sp = prompt(3), SamplingParams()

    def run(between=None):
        r = Runner(target, attention="nsa", nsa=NSA)
        eng = DeviceEngine(r, drafter, overlap=False) if device else None
        return generate_spec(r, drafter, ids, sp, 12, OPTS, engine=eng, between=between)
    plain = run()
    seen = []

    def slow(n):
        seen.append(n)
        time.sleep(0.05)
    paced = run(slow)
    assert paced.token_ids == plain.token_ids
    steps = paced.stats["rounds"] + paced.stats["ar_steps"]
    assert len(seen) == steps and seen == sorted(seen) and seen[-1] == len(paced.token_ids)
    # ~0.05 s a step slept, none of it in the decode time (which the plain run bounds loosely)
    assert paced.stats["decode_seconds"] < 0.05 * steps * 0.5 + 2 * plain.stats["decode_seconds"]
    r = Runner(target, attention="nsa", nsa=NSA)
    with pytest.raises(ValueError, match="non-overlapping engine"):
        generate_spec(r, drafter, ids, sp, 4, OPTS, engine=DeviceEngine(r, drafter, overlap=True), between=slow)


@pytest.mark.parametrize("device_round", [False, True])
def test_eval_spec_paired_rows_take_their_ratio_from_the_interleaved_ar(models, device_round):
    target, drafter = models
    docs = {"code": [prompt(4, 50)], "prose": [prompt(5, 50)]}
    rows = eval_spec(target, drafter, docs, [40], 8, TreeSpec(3, 2, 6), which={"ssv strict"},
                     make_runner=lambda att: Runner(target, attention=att, nsa=NSA), temperatures=[0.0, 0.7],
                     paired=True, device_round=device_round)
    spec = [r for r in rows if r["mode"] == "ssv strict"]
    assert len(spec) == 4
    for r in spec:
        assert r["paired_ar_identical"] is True          # the paired ar's tokens are ar's, sampled too
        assert r["speedup_vs_ar"] == pytest.approx(r["tokens_per_second"] / r["paired_ar_tokens_per_second"])
        assert r["speedup_vs_ar_run"] > 0
    summ = summarize(rows)
    assert all(s["paired"] == (s["mode"] != "ar") for s in summ)
    assert not any(s["paired"] for s in summarize(eval_spec(
        target, drafter, {"code": [prompt(4, 50)]}, [40], 4, TreeSpec(3, 2, 6), which={"ssv strict"},
        make_runner=lambda att: Runner(target, attention=att, nsa=NSA))))
