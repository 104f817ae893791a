"""The CPU-side parts of `ssv bench e2e`: prompts, the mode table, the summary, the step table's cache fill."""
import pytest
import torch

from ssv.bench.e2e import MODES, QUESTION, first_diff, mode_table, prompt_ids, summarize
from ssv.bench.e2e_steps import fill_cache
from ssv.config import NSAConfig
from ssv.engine.runner import Runner
from ssv.ops.nsa.naive import compress_mean
from ssv.spec.tree import TreeSpec

from .conftest import make_tiny_model


class WordTok:
    def encode(self, text):
        return [len(w) for w in text.split()]

    def decode(self, ids):
        return " ".join("x" * i for i in ids)

    def apply_chat_template(self, msgs, add_generation_prompt=True):
        return "<user> " + msgs[0]["content"] + " <assistant>"


def test_prompts_have_the_context_length_and_chat_wraps_a_question():
    tok = WordTok()
    text = " ".join("w" * (1 + i % 7) for i in range(500))
    assert len(prompt_ids(tok, "code", text, 300)) == 300
    chat = prompt_ids(tok, "chat", text, 300)
    assert len(chat) <= 300 and chat[-1] == len("<assistant>")
    # the document's first tokens, then the question (a prompt ending elsewhere needs `end`)
    body = chat[1:len(chat) - len(tok.encode(QUESTION + " <assistant>"))]
    assert body == tok.encode(text)[:len(body)] and len(body) > 250
    with pytest.raises(ValueError, match="fewer than"):
        prompt_ids(tok, "prose", text, 900)


def test_mode_table_covers_the_modes_and_summary_ratios():
    table = mode_table(6, TreeSpec(6, 8, 48))
    assert set(table) | {"transformers"} == set(MODES)
    assert table["ssv strict"][1].verify.group_size == 4 and table["sd-naive"][1].verify.group_size == 1
    assert table["ssv approx C16 reuse/2"][1].verify.refresh == (True, False) * 3
    # the same 48 rows a round
    for m, c in (("ssv strict lookup", 4), ("sd-naive lookup", 1), ("eagle3 dense lookup", 1)):
        o = table[m][1]
        assert o.lookup == 8 and o.spares and o.tree.total_tokens + o.lookup == 48 and o.verify.group_size == c
    rows = [{"family": "code", "target_context": 1024, "mode": m, "tokens_per_second": t, "mean_accepted_length": a,
             "identical_to_ar": True, "gpu_busy_fraction": 0.5, "launches_per_round": 100}
            for m, t, a in (("ar-nsa", 100.0, 1.0), ("ssv strict", 250.0, 2.5))]
    rows.append({"family": "code", "target_context": 1024, "mode": "sd-naive", "error": "boom"})
    s = {r["mode"]: r for r in summarize(rows)}
    assert s["ssv strict"]["speedup_vs_ar_nsa"] == pytest.approx(2.5) and "sd-naive" not in s
    assert first_diff([1, 2, 3], [1, 2, 4]) == 2 and first_diff([1], [1]) is None


def test_summary_of_interleaved_repeats_takes_medians_and_pairs_each_repeat_with_ar():
    """--repeats: a document's tok/s is the median of its repeats; the speedup is the median of the ratios
    to ar-nsa's run of the same repeat (a drift between repeats cancels), its range reported."""
    rows = []
    for rep, (ar, ssv) in enumerate(((100.0, 210.0), (50.0, 100.0), (120.0, 270.0))):   # rep 1: a slow machine
        for mode, t in (("ar-nsa", ar), ("ssv strict", ssv)):
            rows.append({"family": "code", "target_context": 1024, "doc": 0, "rep": rep, "mode": mode,
                         "tokens_per_second": t, "mean_accepted_length": 2.0, "identical_to_ar": rep == 0})
    s = {r["mode"]: r for r in summarize(rows)}
    assert s["ssv strict"]["tokens_per_second"] == 210.0 and s["ar-nsa"]["tokens_per_second"] == 100.0
    assert s["ssv strict"]["speedup_vs_ar_nsa"] == pytest.approx(2.1)      # ratios 2.1, 2.0, 2.25
    assert s["ssv strict"]["speedup_range"] == pytest.approx([2.0, 2.25])
    assert s["ssv strict"]["repeats"] == 3 and s["ssv strict"]["docs"] == 1
    assert s["ssv strict"]["identical_to_ar"] == 1                         # counted over the first repeat


def test_summary_counts_a_mode_measured_only_in_a_later_repeat():
    """Runs merged from processes (each ratio against the same process's ar-nsa, told apart by rep): a
    mode that ran only in rep 1 still reports its agreement with ar, from its own first repeat."""
    rows = [{"family": "code", "target_context": 4096, "doc": 0, "rep": rep, "mode": mode, "tokens_per_second": t,
             "mean_accepted_length": 1.0, "identical_to_ar": True}
            for rep, mode, t in ((0, "ar-nsa", 100.0), (1, "ar-nsa", 80.0), (1, "ar dense", 120.0))]
    s = {r["mode"]: r for r in summarize(rows)}
    assert s["ar dense"]["identical_to_ar"] == 1 and s["ar dense"]["speedup_vs_ar_nsa"] == pytest.approx(1.5)


def test_bench_e2e_refuses_bad_counts():
    import argparse
    from ssv.bench.e2e import add_args, cmd_bench_e2e
    p = argparse.ArgumentParser()
    add_args(p)
    with pytest.raises(ValueError, match="--repeats must be >= 1"):
        cmd_bench_e2e(p.parse_args(["--repeats", "0"]))
    with pytest.raises(ValueError, match="--docs must be >= 1, got 0"):
        cmd_bench_e2e(p.parse_args(["--docs", "0"]))
    with pytest.raises(ValueError, match="--contexts and --steps must be positive token counts, got -1"):
        cmd_bench_e2e(p.parse_args(["--contexts", "4096", "-1"]))
    with pytest.raises(ValueError, match="--contexts and --steps must be positive token counts, got 0"):
        cmd_bench_e2e(p.parse_args(["--steps", "0"]))


def test_fill_cache_leaves_the_compressed_blocks_of_its_keys():
    cfg = NSAConfig(cmp_block=8, cmp_stride=4, slc_block=16, n_select=4, window=16)
    r = Runner(make_tiny_model(0, n_layers=2), attention="nsa", nsa=cfg, max_len=200)
    fill_cache(r, 150, torch.Generator().manual_seed(0))
    assert r.length == int(r.cache.dlen) == 150
    for layer in range(2):
        want = compress_mean(r.cache.k[layer, :, :150], r.cache.n_cmp, cfg)
        torch.testing.assert_close(r.cache.k_cmp[layer, :, : r.cache.n_cmp], want)


def test_ar_margin_is_the_decode_steps_own_margin():
    """The margin at a divergence comes from AR's own decode step at that token (the host steps'
    record), for the context AR actually decoded; None when those steps pick other tokens."""
    from ssv.bench.e2e import GREEDY, ar_margin
    from ssv.engine.generate import generate_ar
    model = make_tiny_model(seed=3)
    runner = Runner(model, attention="nsa", max_len=128)
    prompt = list(range(1, 40))
    ref = generate_ar(runner, prompt, GREEDY, 9, margins=True)
    for at in (0, 4, 8):
        assert ar_margin(runner, prompt, ref.token_ids, at) == ref.stats["top2_margins"][at]
    wrong = list(ref.token_ids)
    wrong[2] = (wrong[2] + 1) % model.cfg.vocab_size
    assert ar_margin(runner, prompt, wrong, 5) is None


def _e2e_doc(commit, cells):
    rows = [dict(family=f, context=c, target_context=c, doc=0, rep=0, mode=m, tokens_per_second=tps,
                 mean_accepted_length=1.0, gpu_busy_fraction=0.8, launches_per_round=10, identical_to_ar=True)
            for f, c, m, tps in cells]
    return {"env": {"commit": commit, "date": "2026-12-03"}, "summary": summarize(rows), "steps": [], "rows": rows}


def test_merge_e2e_keeps_each_ratio_within_its_process(tmp_path, monkeypatch):
    """scripts/merge_e2e.py: rows of several processes in one file, every speedup against the ar-nsa of
    the same (family, context), hence the same process; files of two commits, or two processes timing
    the same cell, are refused."""
    import importlib.util
    import json
    import sys
    from pathlib import Path
    spec = importlib.util.spec_from_file_location("merge_e2e", Path(__file__).parents[1] / "scripts" / "merge_e2e.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    monkeypatch.setattr(mod, "plot", lambda summary, path: None)
    a = _e2e_doc("c1", [("code", 1024, "ar-nsa", 100.0), ("code", 1024, "ssv strict", 150.0)])
    b = _e2e_doc("c1", [("code", 4096, "ar-nsa", 80.0), ("code", 4096, "ssv strict", 200.0)])
    paths = []
    for i, d in enumerate((a, b, _e2e_doc("c2", [("code", 8192, "ar-nsa", 1.0)]),
                           _e2e_doc("c1", [("code", 4096, "ar-nsa", 90.0)]))):
        paths.append(tmp_path / f"{i}.json")
        paths[-1].write_text(json.dumps(d))
    out = tmp_path / "merged.json"
    monkeypatch.setattr(sys, "argv", ["merge", str(out), str(paths[0]), str(paths[1]), "--note", "two"])
    mod.main()
    doc = json.loads(out.read_text())
    ratio = {(s["context"], s["mode"]): s["speedup_vs_ar_nsa"] for s in doc["summary"]}
    assert ratio[(1024, "ssv strict")] == pytest.approx(1.5) and ratio[(4096, "ssv strict")] == pytest.approx(2.5)
    assert doc["env"]["processes"] == "two" and len(doc["rows"]) == 4
    for bad, match in (((paths[0], paths[2]), "different commits"), ((paths[1], paths[3]), "both")):
        monkeypatch.setattr(sys, "argv", ["merge", str(out)] + [str(p) for p in bad])
        with pytest.raises(ValueError, match=match):
            mod.main()


def test_step_table_shapes():
    """`--steps-shape` picks the random model's shape; a context past what that shape is built for is
    refused before anything is allocated; the default model's shape is SmolLM2-135M's."""
    import argparse
    from ssv.bench.e2e import add_args
    from ssv.bench.e2e_steps import SHAPES, run_steps
    p = argparse.ArgumentParser()
    add_args(p)
    assert p.parse_args(["--steps", "4096", "--steps-shape", "smollm2-135m"]).steps_shape == "smollm2-135m"
    assert p.parse_args([]).steps_shape == "llama3.1-8b"
    with pytest.raises(SystemExit):
        p.parse_args(["--steps-shape", "gpt2"])
    with pytest.raises(ValueError, match="smollm2-135m is timed up to 16384"):
        run_steps([32768], [], shape="smollm2-135m")
    s = SHAPES["smollm2-135m"]
    assert (s.hidden_size, s.intermediate_size, s.n_layers, s.n_heads, s.n_kv_heads, s.head_dim, s.vocab_size) == \
        (576, 1536, 30, 9, 3, 64, 49152) and s.tie_embeddings


def test_sampled_runs_have_their_parameters_and_no_identity_count():
    import argparse

    from ssv.bench.e2e import sampling
    p = sampling(argparse.Namespace(temperature=0.7, top_p=0.9))
    assert not p.greedy and p.temperature == 0.7 and p.top_p == 0.9
    assert sampling(argparse.Namespace(temperature=0.0, top_p=1.0)).greedy
    with pytest.raises(ValueError):
        sampling(argparse.Namespace(temperature=-1.0, top_p=1.0))
    rows = [dict(family="code", context=1024, target_context=1024, doc=0, rep=0, mode=m, tokens_per_second=t,
                 mean_accepted_length=1.0, identical_to_ar=None) for m, t in (("ar-nsa", 100.0), ("ssv strict", 150.0))]
    s = {r["mode"]: r for r in summarize(rows)}
    assert s["ssv strict"]["identical_to_ar"] is None and s["ssv strict"]["speedup_vs_ar_nsa"] == pytest.approx(1.5)


def test_profile_rounds_replays_the_runs_sampling_parameters():
    # the launches and busy fraction of a sampled row must come from sampled rounds: until session 34
    # they were the greedy round's (profile_rounds launched without the run's parameters)
    from ssv.bench.e2e import profile_rounds
    from ssv.spec.accept import SamplingParams

    class Recorder:
        def __init__(self):
            self.calls = []

        def launch_spec(self, opts, params=None):
            self.calls.append(("spec", opts, params))
            return len(self.calls)

        def launch_ar(self, params=None):
            self.calls.append(("ar", None, params))
            return len(self.calls)

        def finish(self, t):
            return []

        def catch_up(self):
            self.calls.append(("catch-up", None, None))

    hot = SamplingParams(temperature=0.7, top_p=0.9)
    for opts in (None, object()):
        eng = Recorder()
        out = profile_rounds(eng, opts, hot, rounds=3)
        assert [c[2] for c in eng.calls] == [hot] * 3
        assert {c[0] for c in eng.calls} == {"ar" if opts is None else "spec"}
        assert out["profiled_rounds"] == 3
    # after a generation: the fall-back's waiting rows committed first; a run that never ran a round
    # is profiled as AR steps
    from ssv.bench.e2e import profile_run
    for rounds, kind in ((5, "spec"), (0, "ar")):
        eng = Recorder()
        out = profile_run(eng, object(), hot, {"rounds": rounds, "ar_steps": 40})
        assert eng.calls[0][0] == "catch-up" and {c[0] for c in eng.calls[1:]} == {kind}
        assert out["profiled"] == ("rounds" if rounds else "ar steps")


def test_only_the_ar_modes_are_the_references_of_identity():
    from ssv.bench.e2e import compare_to_ar
    ref = {}
    # a run without ar-nsa (its first mode sd-naive) compares nothing: not "identical" to itself
    assert compare_to_ar("sd-naive", "nsa", [5, 6, 7], ref, True) == (None, None) and ref == {}
    assert compare_to_ar("ar-nsa", "nsa", [5, 6, 8], ref, True) == ([5, 6, 8], None)
    assert compare_to_ar("ssv strict", "nsa", [5, 6, 7], ref, True) == ([5, 6, 8], 2)
    assert compare_to_ar("ar-nsa", "nsa", [9], ref, True) == ([5, 6, 8], 0)   # a second repeat: the first stays
    # dense modes against ar dense only; sampled runs never report a difference
    assert compare_to_ar("eagle3 dense", "dense", [5], ref, True) == (None, None)
    assert compare_to_ar("ar dense", "dense", [5, 6], ref, True) == ([5, 6], None)
    assert compare_to_ar("eagle3 dense", "dense", [5, 7], ref, False) == ([5, 6], None)



def test_a_run_in_parts_keeps_every_parts_environment():
    from ssv.bench.e2e import keep_earlier
    env = lambda dev, c="abc": {"device": dev, "commit": c}   # noqa: E731
    samp = {"temperature": 0.0, "top_p": 1.0, "seed": 0}
    first = {"env": env("H100"), "sampling": samp, "summary": [1], "steps": [2], "rows": [3]}
    doc = keep_earlier({"env": env("H200"), "sampling": samp, "summary": [], "steps": [], "rows": []}, first)
    assert (doc["rows"], doc["steps"]) == ([3], [2]) and [e["device"] for e in doc["parts_env"]] == ["H100", "H200"]
    third = keep_earlier({"env": env("H100"), "sampling": samp, "summary": [], "steps": [], "rows": []}, doc)
    assert [e["device"] for e in third["parts_env"]] == ["H100", "H200", "H100"]
    # another commit or other sampling parameters: nothing is kept
    for other in ({**first, "env": env("H100", "def")}, {**first, "sampling": {**samp, "temperature": 0.7}}):
        fresh = {"env": env("H200"), "sampling": samp, "summary": [], "steps": [], "rows": []}
        assert keep_earlier(fresh, other)["rows"] == [] and "parts_env" not in fresh
