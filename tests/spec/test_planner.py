"""Profile-guided adaptive planning: profiles, ranking, online switching, and the engine under a planner."""
import json

import pytest
import torch

from ssv.engine.generate import generate_ar
from ssv.engine.runner import Runner
from ssv.engine.spec import generate_spec
from ssv.spec.accept import SamplingParams
from ssv.spec.planner import AdaptivePlanner, Entry, Profile, Strategy, expected_length
from ssv.spec.tree import TreeSpec

DEEP = Strategy("deep", TreeSpec(6, 8, 48), group_size=4)
SHALLOW = Strategy("shallow", TreeSpec(2, 4, 8), group_size=2)
APPROX = Strategy("approx", TreeSpec(6, 8, 48), group_size=16, precision="approx", refresh_every=2)


def profile():
    # short contexts: the deep tree pays (4.0 / 0.2 = 20 tok/s vs 2.0 / 0.12 = 16.7);
    # long contexts: rounds cost more and the shallow tree wins (2.0 / 0.2 = 10 vs 3.0 / 0.5 = 6)
    return Profile([1024, 8192], [[Entry(DEEP, 4.0, 0.2), Entry(SHALLOW, 2.0, 0.12), Entry(APPROX, 3.8, 0.1)],
                                  [Entry(DEEP, 3.0, 0.5), Entry(SHALLOW, 2.0, 0.2)]])


def test_strategy_validation_and_options():
    with pytest.raises(ValueError, match="approx"):
        Strategy("x", TreeSpec(2, 2, 4), refresh_every=2)
    with pytest.raises(ValueError, match="group size"):
        Strategy("x", TreeSpec(2, 2, 4), group_size=3)
    with pytest.raises(ValueError, match="traversal"):
        Strategy("x", TreeSpec(2, 2, 4), order="zigzag")
    o = APPROX.options(n_layers=5)
    assert o.verify.refresh == (True, False, True, False, True) and o.verify.precision == "approx"
    assert DEEP.options(5).verify.refresh is None and DEEP.options(5).tree == TreeSpec(6, 8, 48)
    assert Strategy.from_json(json.loads(json.dumps(APPROX.to_json()))) == APPROX


def test_profile_buckets_ranking_and_json(tmp_path):
    p = profile()
    assert [p.bucket(c) for c in (1, 1024, 1025, 8192, 10 ** 6)] == [0, 0, 1, 1, 1]
    assert [e.strategy.name for e in p.ranked(0)] == ["deep", "shallow"]           # approx needs consent
    assert [e.strategy.name for e in p.ranked(0, allow_approx=True)][0] == "approx"
    assert [e.strategy.name for e in p.ranked(1)] == ["shallow", "deep"]
    p.save(tmp_path / "p.json")
    q = Profile.load(tmp_path / "p.json")
    assert q.bounds == p.bounds and q.entries == p.entries
    # drafting twice as good as profiled: the deep tree's drafted part doubles, capped at depth + 1
    assert expected_length(Entry(DEEP, 4.0, 0.2), 2.0) == 7.0
    assert expected_length(Entry(SHALLOW, 2.0, 0.1), 5.0) == 3.0
    # a looked-up chain of 6 reaches past the tree's depth of 2: capped at the chain's 6 + 1
    chained = Strategy("chained", TreeSpec(2, 4, 8), group_size=2, lookup=6)
    assert expected_length(Entry(chained, 2.0, 0.1), 5.0) == 6.0
    assert expected_length(Entry(chained, 2.0, 0.1), 10.0) == 7.0


@pytest.mark.parametrize("bad, msg", [
    (dict(bounds=[8192, 1024]), "ascending"),
    (dict(bounds=[1024]), "one list"),
    (dict(entries=[[], [Entry(DEEP, 3.0, 0.5)]]), "no strategy"),
    (dict(entries=[[Entry(DEEP, 3.0, 0.5), Entry(DEEP, 2.0, 0.5)], [Entry(DEEP, 3.0, 0.5)]]), "twice"),
])
def test_bad_profiles(bad, msg):
    kw = dict(bounds=[1024, 8192], entries=[[Entry(DEEP, 3.0, 0.5)], [Entry(DEEP, 3.0, 0.5)]])
    kw.update(bad)
    with pytest.raises(ValueError, match=msg):
        Profile(**kw)


def test_bad_entries_and_files(tmp_path):
    with pytest.raises(ValueError, match="accepted length"):
        Entry(DEEP, 0.5, 0.1)
    with pytest.raises(ValueError, match="seconds"):
        Entry(DEEP, 2.0, 0.0)
    with pytest.raises(FileNotFoundError):
        Profile.load(tmp_path / "missing.json")
    (tmp_path / "x.json").write_text("{not json")
    with pytest.raises(ValueError, match="not JSON"):
        Profile.load(tmp_path / "x.json")
    (tmp_path / "y.json").write_text("{}")
    with pytest.raises(ValueError, match="not a speculation profile"):
        Profile.load(tmp_path / "y.json")
    # a bad entry is refused naming the file that holds it
    good = Profile([10], [[Entry(DEEP, 3.0, 0.1)]])
    good.save(tmp_path / "z.json")
    doc = json.loads((tmp_path / "z.json").read_text())
    bad = json.loads(json.dumps(doc).replace('"depth": %d' % DEEP.tree.depth, '"depth": 0'))
    assert bad != doc
    (tmp_path / "z.json").write_text(json.dumps(bad))
    with pytest.raises(ValueError, match=r"profile .*z\.json: TreeSpec\.depth must be"):
        Profile.load(tmp_path / "z.json")
    only_approx = Profile([10], [[Entry(APPROX, 3.0, 0.1)]])
    with pytest.raises(ValueError, match="no strict strategy"):
        AdaptivePlanner(only_approx, 4).choose(5)


def test_profile_from_benchmark_rows():
    rows = [dict(context=1024, mode="ar", mean_accepted_length=1.0, tokens_per_second=10.0),
            dict(context=1024, mode="ssv strict", mean_accepted_length=3.0, tokens_per_second=15.0),
            dict(context=1024, mode="ssv strict", mean_accepted_length=2.0, tokens_per_second=10.0),
            dict(context=4096, mode="ssv strict", mean_accepted_length=2.5, tokens_per_second=5.0)]
    p = Profile.from_rows(rows, {"ssv strict": DEEP}, meta={"device": "test"})
    assert p.bounds == [2560, 4096] and [len(es) for es in p.entries] == [1, 1]   # the 1K rows serve up to 2560
    assert p.meta == {"device": "test", "contexts": [1024, 4096]}
    assert p.bucket(1025) == 0 and p.bucket(2561) == 1 and p.bucket(9000) == 1
    e = p.entries[0][0]
    assert e.strategy == DEEP and e.mean_accepted_length == 2.5 and abs(e.seconds_per_round - 0.2) < 1e-12
    with pytest.raises(ValueError, match="known strategy"):
        Profile.from_rows(rows, {"other": DEEP})


def test_planner_switches_on_bucket_and_on_acceptance():
    pl = AdaptivePlanner(profile(), n_layers=4, window=4, tolerance=0.25)
    assert pl.choose(500).tree == DEEP.tree and pl.current == DEEP
    for _ in range(8):  # as profiled (4.0 per round): no switch
        pl.observe(4)
        pl.choose(600)
    assert pl.current == DEEP and len(pl.switches) == 1
    for _ in range(8):  # drafting far worse than profiled: the cheap shallow tree wins (after two windows)
        pl.observe(1)
        pl.choose(700)
    assert pl.current == SHALLOW and pl.switches[-1]["reason"] == "acceptance"
    assert pl.scale == pytest.approx(0.05)   # (1 - 1) / 3, clamped
    pl.choose(5000)                           # a longer context: its bucket's best under the same scale
    assert pl.current == SHALLOW and pl.summary()["strategy"] == "shallow"
    with pytest.raises(ValueError):
        AdaptivePlanner(profile(), 4, window=0)
    with pytest.raises(RuntimeError):
        AdaptivePlanner(profile(), 4).observe(2)


def test_planner_keeps_the_current_strategy_on_a_tie_and_checks_buckets_upfront():
    a, b = Strategy("a", TreeSpec(4, 2, 8)), Strategy("b", TreeSpec(4, 2, 8), group_size=2)
    pl = AdaptivePlanner(Profile([100], [[Entry(b, 3.0, 0.3), Entry(a, 3.0, 0.3)]]), 4, window=2)
    pl.choose(10)
    assert pl.current == a                    # a tie at the start: the name decides
    pl._entry = Entry(b, 3.0, 0.3)            # now on b: a re-rank that ties must not move
    pl.observe(1), pl.observe(1)
    assert pl.current == b
    mixed = Profile([10, 100], [[Entry(a, 2.0, 0.1)], [Entry(APPROX, 3.0, 0.1)]])
    with pytest.raises(ValueError, match="no strict strategy"):
        AdaptivePlanner(mixed, 4)             # refused before any generation, not when the bucket is reached
    assert AdaptivePlanner(mixed, 4, allow_approx=True).choose(50).verify.precision == "approx"


def test_planner_moves_to_deeper_tree_when_drafting_is_better():
    p = Profile([4096], [[Entry(DEEP, 2.0, 0.3), Entry(SHALLOW, 1.5, 0.2)]])   # shallow 7.5 vs deep 6.7 tok/s
    pl = AdaptivePlanner(p, n_layers=4, window=3)
    pl.choose(100)
    assert pl.current == SHALLOW
    for _ in range(3):
        pl.observe(3)                         # the shallow tree's maximum: drafting is 4x as good as profiled
    pl.choose(110)
    assert pl.scale == pytest.approx(4.0)
    assert pl.current == DEEP                 # deep: 1 + 1.0 * 4 = 5 per 0.3 s (16.7/s) > shallow: 3 per 0.2 s (15/s)


def test_generate_spec_under_a_planner_equals_ar():
    """Strict strategies switched by the planner mid-generation keep the output of autoregressive NSA."""
    import importlib.util
    from pathlib import Path
    spec = importlib.util.spec_from_file_location("engine_test_spec", Path(__file__).parents[1] / "engine" / "test_spec.py")
    helpers = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(helpers)   # its tiny target, NSA settings and oracle drafter
    NSA, OracleDrafter = helpers.NSA, helpers.OracleDrafter

    model = helpers.tiny_target(3)
    gen = torch.Generator().manual_seed(5)
    prompt = torch.randint(0, 64, (70,), generator=gen).tolist()

    def runner():
        return Runner(model, attention="nsa", nsa=NSA)
    ar = generate_ar(runner(), prompt, SamplingParams(), 40)
    p = Profile([80, 512], [[Entry(DEEP, 4.0, 0.2), Entry(SHALLOW, 2.0, 0.12)],
                            [Entry(SHALLOW, 2.0, 0.1), Entry(Strategy("mid", TreeSpec(4, 2, 12), "dfs", 1), 3.0, 0.2)]])
    pl = AdaptivePlanner(p, model.cfg.n_layers, window=2)
    d = OracleDrafter(ar.token_ids[1:], 64)
    d.n_prompt = len(prompt)
    sd = generate_spec(runner(), d, prompt, SamplingParams(), 40, planner=pl)
    assert sd.token_ids == ar.token_ids
    st = sd.stats["planner"]
    assert len(st["switches"]) >= 2 and st["switches"][0]["to"] == "deep"
    assert any(s["reason"] == "bucket" and s["context"] > 80 for s in st["switches"])
    assert sum(st["rounds_by_strategy"].values()) == sd.stats["rounds"] and sd.stats["precision"] == "strict"
    again = generate_spec(runner(), d, prompt, SamplingParams(), 40, planner=pl)   # the planner starts afresh
    assert again.token_ids == ar.token_ids and again.stats["planner"] == st
    with pytest.raises(ValueError, match="planner"):
        generate_spec(runner(), d, prompt, SamplingParams(), 4)
