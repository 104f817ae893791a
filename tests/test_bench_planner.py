"""`ssv bench planner` on the CPU: profile, mixed set, the adaptive planner's runs and the summary."""
import pytest
import torch

from ssv.bench.planner import mixed_set, profile, run_mixed, strategy_space, summarize, switch_costs
from ssv.config import NSAConfig
from ssv.draft import Eagle3Drafter
from ssv.engine.device_round import DeviceEngine
from ssv.engine.runner import Runner
from ssv.spec.planner import Strategy
from ssv.spec.tree import TreeSpec

from .draft.helpers import tiny_head, tiny_target

NSA = NSAConfig(cmp_block=8, cmp_stride=4, slc_block=16, n_select=4, forced_local=1, window=16)


def test_strategy_space_is_strict_unless_approx_is_allowed():
    strict = strategy_space()
    assert all(s.precision == "strict" for s in strict) and len({s.name for s in strict}) == len(strict)
    sizes = [s.tree.total_tokens for s in strict if s.group_size == 4 and s.order == "pos" and not s.lookup]
    assert sizes == sorted(sizes) and sizes[0] <= 8 and sizes[-1] >= 96
    # the lookup strategies verify as many rows as a tree without one (the same graph's shapes), each valid
    rows = {s.tree.total_tokens + s.lookup for s in strict if s.lookup}
    assert len(rows) >= 3 and rows <= set(sizes)
    for s in strict:
        assert s.options(6).max_depth == max(s.tree.depth, s.lookup)
    more = strategy_space(allow_approx=True)
    assert {s.precision for s in more} == {"strict", "approx"} and more[: len(strict)] == strict


def test_switch_cost_is_the_round_after_a_switch_against_the_strategys_other_rounds():
    sw = [{"round": 0, "from": None, "to": "a"}, {"round": 3, "from": "a", "to": "b"},
          {"round": 5, "from": "b", "to": "a"}]
    t = [1.0, 1.0, 1.2, 5.0, 2.0, 3.0, 1.0]
    # round 3 (b): 5 - median(b's round 4) = 3; round 5 (a): 3 - median(1, 1, 1.2, 1) = 2
    assert switch_costs(sw, t) == pytest.approx([3.0, 2.0])
    assert switch_costs([{"round": 0, "from": None, "to": "a"}, {"round": 2, "from": "a", "to": "b"}],
                        [1.0, 1.0, 4.0]) == [None]     # b ran no other round: no baseline


def test_summary_of_planted_runs():
    rows = []
    # two prompts: strategy x is fast on prompt 0, y on prompt 1; adaptive in between
    secs = {("ar-nsa", 0): 4.0, ("x", 0): 1.0, ("y", 0): 2.0, ("adaptive", 0): 1.2,
            ("ar-nsa", 1): 4.0, ("x", 1): 3.0, ("y", 1): 1.0, ("adaptive", 1): 1.5}
    for rep, drift in ((0, 1.0), (1, 3.0), (2, 1.0)):   # a slow repeat: the medians ignore it
        for (run, p), s in secs.items():
            r = {"prompt": p, "rep": rep, "run": run, "tokens": [0] * 11, "decode_seconds": s * drift,
                 "mean_accepted_length": 2.0}
            if run == "adaptive":
                r.update(switches=[{"round": 0, "from": None, "to": "x", "reason": "bucket"},
                                   {"round": 4, "from": "x", "to": "y", "reason": "acceptance"}],
                         switch_cost_seconds=[0.001], rounds_by_strategy={"x": 4, "y": 2})
            rows.append(r)
    s = summarize(rows)
    assert s["runs"]["x"]["tokens_per_second"] == pytest.approx(20 / 4.0)
    assert s["runs"]["y"]["tokens_per_second"] == pytest.approx(20 / 3.0) and s["best_fixed"] == "y"
    assert s["oracle_per_prompt"]["tokens_per_second"] == pytest.approx(20 / 2.0)
    assert s["oracle_per_prompt"]["picks"] == {"x": 1, "y": 1}
    assert s["adaptive_vs_best_fixed"] == pytest.approx((20 / 2.7) / (20 / 3.0))
    assert s["switches_per_prompt"] == 1.0 and s["switch_reasons"] == {"bucket": 0, "acceptance": 2}
    assert s["switch_cost_ms_median"] == pytest.approx(1.0) and s["adaptive_rounds_by_strategy"] == {"x": 8, "y": 4}
    assert s["runs"]["adaptive"]["identical_to_ar_nsa"] == "2/2"


def test_profile_and_mixed_set_on_the_device_round_keep_ar_tokens():
    """The whole benchmark on a tiny target: a profile from real runs, every strict run (fixed or
    adaptive) token-identical to ar-nsa on every prompt of the mixed set."""
    target = tiny_target(vocab=80, layers=4)
    drafter = Eagle3Drafter(tiny_head(target, draft_vocab=40), target)
    runner = Runner(target, attention="nsa", nsa=NSA, max_len=200)
    engine = DeviceEngine(runner, drafter, graphs=False)
    gen = torch.Generator().manual_seed(3)
    ctx = [40, 90]
    docs = lambda n: {f: [{L: torch.randint(3, 80, (L,), generator=gen).tolist() for L in ctx} for _ in range(n)]  # noqa: E731
                      for f in ("code", "prose")}
    space = [Strategy("small", TreeSpec(2, 2, 4)), Strategy("big", TreeSpec(3, 3, 9), order="bfs", group_size=2),
             Strategy("chain", TreeSpec(2, 2, 4), lookup=2)]
    rows, prof = profile(runner, engine, drafter, docs(1), ctx, space, 12)
    assert len(rows) == 2 * 2 * 3 and prof.bounds == [65, 90] and prof.meta["contexts"] == ctx
    assert all(r["tokens_per_second"] > 0 and r["mean_accepted_length"] >= 1 for r in rows)
    ev = docs(1)
    items = mixed_set(ev, ctx, seed=1)
    assert sorted(items) == sorted((f, 0, L) for f in ev for L in ctx)
    assert items == mixed_set(ev, ctx, seed=1)
    mixed = run_mixed(runner, engine, drafter, ev, items, space, prof, 12, repeats=2)
    assert len(mixed) == 2 * len(items) * 5
    orders = {tuple(r["run"] for r in mixed if (r["prompt"], r["rep"]) == key) for key in {(0, 0), (1, 0)}}
    assert len(orders) == 2                      # the run order rotates
    s = summarize(mixed)
    assert all(t["identical_to_ar_nsa"] == f"{len(items)}/{len(items)}" for t in s["runs"].values())
    assert s["best_fixed"] in ("small", "big", "chain") and s["oracle_vs_best_fixed"] >= 1.0
    assert sum(s["adaptive_rounds_by_strategy"].values()) > 0


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_adaptive_runs_replayed_from_graphs_equal_eager_runs():
    """The planner switching strategies between captured graphs: the same tokens and switches as the
    same run on the same GPU without graphs."""
    target = tiny_target(vocab=80, layers=4, head_dim=16).cuda()
    drafter = Eagle3Drafter(tiny_head(target, draft_vocab=40).cuda(), target)
    gen = torch.Generator().manual_seed(4)
    ctx = [40, 90]
    docs = {"code": [{L: torch.randint(3, 80, (L,), generator=gen).tolist() for L in ctx}]}
    space = [Strategy("small", TreeSpec(2, 2, 4)), Strategy("big", TreeSpec(3, 3, 9), order="bfs", group_size=2)]
    out, prof = [], None
    for graphs in (False, True):
        runner = Runner(target, attention="nsa", nsa=NSA, max_len=200)
        engine = DeviceEngine(runner, drafter, graphs=graphs)
        # one profile for both: its ranking comes from timings, which differ between the two runs
        prof = prof or profile(runner, engine, drafter, docs, ctx, space, 12)[1]
        rows = run_mixed(runner, engine, drafter, docs, mixed_set(docs, ctx), space, prof, 24)
        out.append([(r["run"], r["tokens"], r.get("switches")) for r in rows])
    assert out[0] == out[1]


def test_bad_arguments_are_refused_before_any_model_loads(tmp_path):
    import argparse
    import json

    from ssv.bench.planner import add_args, cmd_bench_planner
    p = argparse.ArgumentParser()
    add_args(p)
    prompts = tmp_path / "p.json"
    prompts.write_text(json.dumps({"code": ["a"], "prose": ["b"], "chat": ["c"]}))
    with pytest.raises(ValueError, match="held out"):
        cmd_bench_planner(p.parse_args(["--prompts", str(prompts), "--profile-docs", "0", "--eval-docs", "0"]))
    with pytest.raises(ValueError, match="fewer than 4 documents"):
        cmd_bench_planner(p.parse_args(["--prompts", str(prompts)]))
    with pytest.raises(FileNotFoundError):
        cmd_bench_planner(p.parse_args(["--prompts", str(tmp_path / "none.json")]))
    with pytest.raises(ValueError, match=">= 1"):
        cmd_bench_planner(p.parse_args(["--prompts", str(prompts), "--repeats", "0"]))
    with pytest.raises(ValueError, match="unknown strategies.*'strict 9x9x9'"):
        cmd_bench_planner(p.parse_args(["--prompts", str(prompts), "--strategies", "strict 6x8x48", "strict 9x9x9"]))
