"""`ssv bench spec` by family and temperature: the family prompts, the rows, the summary, the command."""
import json
import random

import pytest

from ssv.bench.e2e import QUESTION, prompt_ids
from ssv.bench.spec import check_families, eval_spec, family_documents, summarize
from ssv.draft import Eagle3Drafter
from ssv.engine.runner import Runner
from ssv.spec.tree import TreeSpec

from .draft.helpers import tiny_head, tiny_target
from .engine.test_spec import NSA
from .test_bench_e2e import WordTok   # one token per word, its length (1..20: inside the tiny vocabulary)
from .test_cli import fails, fast_default, succeeds  # noqa: F401 -- fixtures

CONTEXTS = [40, 70]


def text(seed: int, words: int) -> str:
    rng = random.Random(seed)
    return " ".join("w" * rng.randint(1, 20) for _ in range(words))


TEXTS = {"code": [text(1, 120)], "chat": [text(2, 120)], "prose": [text(3, 120)]}


@pytest.fixture(scope="module")
def setup():
    target = tiny_target()
    drafter = Eagle3Drafter(tiny_head(target, draft_vocab=40, window=64), target)
    docs = family_documents(WordTok(), TEXTS, ["code", "chat"], CONTEXTS, 1)

    def run(temperatures, seed=0):
        return eval_spec(target, drafter, docs, CONTEXTS, 8, TreeSpec(3, 2, 6), which={"ssv strict"},
                         make_runner=lambda att: Runner(target, attention=att, nsa=NSA), warmup=2,
                         temperatures=temperatures, seed=seed)
    return docs, run, run([0.0, 0.7]), (target, drafter)


def test_family_documents_build_each_familys_prompts_at_each_context(setup):
    docs = setup[0]
    assert set(docs) == {"code", "chat"} and all(len(ds) == 1 for ds in docs.values())
    code, chat = docs["code"][0], docs["chat"][0]
    assert code == {L: WordTok().encode(TEXTS["code"][0])[:L] for L in CONTEXTS}
    for L in CONTEXTS:  # chat: the document cut to fit, the question, the template
        assert len(chat[L]) <= L and chat[L][-1] == len("<assistant>")


def test_aligned_documents_continue_the_same_text_at_every_context():
    tok = WordTok()
    docs = family_documents(tok, TEXTS, ["code", "prose", "chat"], CONTEXTS, 1, aligned=True)
    for fam in ("code", "prose"):
        ids = tok.encode(TEXTS[fam][0])
        assert docs[fam][0] == {L: ids[max(CONTEXTS) - L:max(CONTEXTS)] for L in CONTEXTS}
    chat, ids = docs["chat"][0], tok.encode(TEXTS["chat"][0])
    question = tok.encode(QUESTION + " <assistant>")
    for L in CONTEXTS:   # the body ends at the same document token at every length, then the question
        assert len(chat[L]) <= L and chat[L][-1] == len("<assistant>")
        body = chat[L][1:len(chat[L]) - len(question)]
        assert body == ids[max(CONTEXTS) - len(body):max(CONTEXTS)]
    unaligned = family_documents(tok, TEXTS, ["code"], CONTEXTS, 1)["code"][0]
    assert unaligned[CONTEXTS[0]] != docs["code"][0][CONTEXTS[0]]   # the default starts at the document's start
    with pytest.raises(ValueError, match="cannot end at token 30"):
        prompt_ids(tok, "code", TEXTS["code"][0], 40, end=30)
    with pytest.raises(ValueError, match="fewer than 200"):
        prompt_ids(tok, "code", TEXTS["code"][0], 40, end=200)


def test_rows_carry_family_and_temperature_and_summary_groups_by_them(setup):
    rows = setup[2]
    assert {(r["family"], r["context"], r["temperature"], r["mode"]) for r in rows} == {
        (f, L, t, m) for f in ("code", "chat") for L in CONTEXTS for t in (0.0, 0.7) for m in ("ar", "ssv strict")}
    summ = summarize(rows)
    assert len(summ) == 2 * 2 * 2 * 2 and all(s["docs"] == 1 for s in summ)   # one per family, not pooled
    for s in summ:
        (r,) = [r for r in rows if (r["family"], r["context"], r["temperature"], r["mode"])
                == (s["family"], s["context"], s["temperature"], s["mode"])]
        assert s["mean_accepted_length"] == r["mean_accepted_length"]
        assert s["acceptance_by_depth"] == r.get("acceptance_by_depth")
        if s["mode"] != "ar":
            assert len(s["acceptance_by_depth"]) == 3


def test_greedy_strict_rows_are_identical_to_ar(setup):
    greedy = [r for r in setup[2] if r["temperature"] == 0.0 and r["mode"] == "ssv strict"]
    assert len(greedy) == 4 and all(r["first_diff_vs_ar"] is None and r["tokens"] == 8 for r in greedy)
    summ = [s for s in summarize(setup[2], 8) if s["temperature"] == 0.0 and s["mode"] == "ssv strict"]
    assert all(s["identical_to_ar"] == 1 and s["divergences"] == 0 and s["tokens_compared"] == 8 for s in summ)
    ar = [r for r in setup[2] if r["temperature"] == 0.0 and r["mode"] == "ar"]
    assert all(r["min_top2_margin"] >= 0 for r in ar)


def test_device_round_rows_match_the_host_rounds(setup):
    """--device-round runs ar and the modes on the DeviceEngine (what `ssv generate` runs): greedy, the
    same tokens as the host round's rows (fp32 on the CPU) and as ar; ar without top-2 margins."""
    docs, _, host, (target, drafter) = setup
    rows = eval_spec(target, drafter, docs, CONTEXTS, 8, TreeSpec(3, 2, 6), which={"ssv strict"},
                     make_runner=lambda att: Runner(target, attention=att, nsa=NSA), temperatures=[0.0],
                     device_round=True)
    key = lambda r: (r["family"], r["context"], r["mode"])   # noqa: E731
    host = {key(r): r for r in host if r["temperature"] == 0.0}
    assert len(rows) == len(host) == 8
    for r in rows:
        h = host[key(r)]
        assert r["mean_accepted_length"] == h["mean_accepted_length"]
        if r["mode"] == "ar":
            assert r["min_top2_margin"] is None
        else:
            assert r["first_diff_vs_ar"] is None and r["tokens"] == 8 and r["rounds"] == h["rounds"]


def test_repeats_interleave_runs_and_summarize_by_median(setup):
    docs, _, _, _ = setup
    target = tiny_target()
    drafter = Eagle3Drafter(tiny_head(target, draft_vocab=40, window=64), target)
    rows = eval_spec(target, drafter, {"code": docs["code"]}, CONTEXTS[:1], 6, TreeSpec(3, 2, 6),
                     which={"ssv strict"}, make_runner=lambda att: Runner(target, attention=att, nsa=NSA),
                     repeats=3)
    assert [(r["rep"], r["mode"]) for r in rows] == [(k, m) for k in range(3) for m in ("ar", "ssv strict")]
    spec = [r for r in rows if r["mode"] == "ssv strict"]
    assert len({r["mean_accepted_length"] for r in spec}) == 1      # a repeat is the same run again
    for i, r in enumerate(spec):   # planted timings: the summary takes medians, not means
        r["speedup_vs_ar"], r["tokens_per_second"] = [1.0, 5.0, 2.0][i], [10.0, 50.0, 20.0][i]
    (s,) = [x for x in summarize(rows, 6) if x["mode"] == "ssv strict"]
    assert s["repeats"] == 3 and s["docs"] == 1 and s["speedup_vs_ar"] == 2.0 and s["tokens_per_second"] == 20.0
    assert s["speedup_range"] == [1.0, 5.0]
    assert s["identical_to_ar"] == 1 and s["divergences"] == 0 and s["tokens_compared"] == 6   # counted once
    with pytest.raises(ValueError, match="repeats"):
        eval_spec(target, drafter, {"code": docs["code"]}, CONTEXTS[:1], 6, TreeSpec(3, 2, 6), repeats=0)


def test_sampled_rows_have_no_first_difference_and_are_seeded(setup):
    _, run, rows, _ = setup
    sampled = [r for r in rows if r["temperature"] == 0.7]
    assert len(sampled) == 8 and all(r["first_diff_vs_ar"] is None for r in sampled)
    assert all(r["ar_margin_at_diff"] is None for r in sampled if r["mode"] != "ar")
    assert all(r["min_top2_margin"] is None for r in sampled if r["mode"] == "ar")
    for s in summarize(rows):   # not compared with ar: its tokens differ by design
        if s["temperature"] == 0.7:
            assert s["identical_to_ar"] is s["divergences"] is s["divergence_rate"] is None
    again = run([0.7])          # the same seed: the same runs
    keys = ("family", "context", "mode", "tokens", "rounds", "mean_accepted_length", "acceptance_by_depth")
    assert [[r.get(k) for k in keys] for r in again] == [[r.get(k) for k in keys] for r in sampled]


def test_bad_family_input():
    tok = WordTok()
    with pytest.raises(ValueError, match="prose document 0: a prose document has 120 tokens, fewer than 200"):
        family_documents(tok, TEXTS, ["prose"], [40, 200], 1)
    with pytest.raises(ValueError, match="chat document 0 has 120 tokens, fewer than 200"):
        family_documents(tok, TEXTS, ["chat"], [200], 1)
    with pytest.raises(ValueError, match="1 code documents, fewer than --docs 2"):
        family_documents(tok, TEXTS, ["code"], [40], 2)
    with pytest.raises(ValueError, match=r"unknown families \['poetry'\]: --prompts has \['chat', 'code', 'prose'\]"):
        check_families(["code", "poetry"], TEXTS)
    with pytest.raises(ValueError, match="only 'code'"):
        check_families(["prose"])
    with pytest.raises(ValueError, match="twice"):
        check_families(["code", "code"], TEXTS)
    assert check_families(None, TEXTS) == ["code", "prose", "chat"] and check_families(None) == ["code"]
    with pytest.raises(ValueError, match="temperature"):
        eval_spec(None, None, [], [], 1, TreeSpec(3, 2, 6), temperatures=[-1.0])


def test_old_rows_without_family_still_summarize():
    old = [dict(context=8, doc=d, mode="m", tokens=10, mean_accepted_length=2.0 + d, tokens_per_second=1.0,
                first_diff_vs_ar=None, acceptance_by_depth=[0.5, 0.25][: 2 - d]) for d in range(2)]
    new = [dict(old[0], family="prose", temperature=0.0)]
    code, prose = summarize(old + new)
    assert (code["family"], code["temperature"], code["docs"], code["mean_accepted_length"]) == ("code", 0.0, 2, 2.5)
    assert code["acceptance_by_depth"] == [0.5, 0.125]    # the shorter list padded with 0
    assert code["identical_to_ar"] == 2 and code["tokens_compared"] == 20
    assert (prose["family"], prose["docs"]) == ("prose", 1)


def test_bench_spec_command_by_family_and_temperature(capsys, fast_default, random_head, tmp_path):
    words = "The quick brown fox jumps over the lazy dog while the cat sleeps by the warm fire. " * 12
    prompts = tmp_path / "prompts.json"
    prompts.write_text(json.dumps({"code": ["def f(x):\n    return x + 1\n" * 20], "chat": [words]}))
    args = ["bench", "spec", "--device", "cpu", "--draft", random_head, "--contexts", 48, "--docs", 1,
            "--new-tokens", 4, "--warmup", 0, "--tree-depth", 3, "--tree-topk", 2, "--tree-tokens", 6,
            "--out", tmp_path, "--modes", "ssv strict", "--prompts", prompts, "--families", "code", "chat",
            "--temperatures", 0, 0.7]
    out = succeeds(args, capsys).out
    d = json.loads((tmp_path / "spec-cpu.json").read_text())
    assert {(s["family"], s["temperature"], s["mode"]) for s in d["summary"]} == {
        (f, t, m) for f in ("code", "chat") for t in (0.0, 0.7) for m in ("ar", "ssv strict")}
    assert all(r["first_diff_vs_ar"] is None for r in d["rows"])   # strict fp32 greedy: ar's; sampled: by design
    prof = json.loads((tmp_path / "profile-cpu.json").read_text())
    assert prof["meta"]["temperature"] == 0.0 and "code, chat" in prof["meta"]["source"]
    assert out.splitlines()[0].split()[:3] == ["family", "context", "temp"]
    assert any(line.split()[:3] == ["chat", "48", "0.7"] for line in out.splitlines())
    base = args[:args.index("--prompts")]
    fails(base + ["--prompts", prompts, "--families", "prose"], capsys, "unknown families ['prose']")
    fails(base + ["--families", "chat"], capsys, "only 'code'")
    fails(base + ["--prompts", tmp_path / "none.json"], capsys, "none.json")
    fails(base + ["--temperatures", -0.5], capsys, "temperature")
    fails(base + ["--aligned"], capsys, "--aligned needs --prompts")
    # --paired --aligned: each mode's ratio over an ar interleaved with it; the prompts end at one point
    succeeds(base + ["--prompts", prompts, "--families", "code", "--temperatures", 0, "--paired", "--aligned",
                     "--contexts", 40, 48], capsys)
    pa = json.loads((tmp_path / "spec-cpu.json").read_text())
    assert [s["paired"] for s in pa["summary"]] == [False, True, False, True]
    assert all(r["paired_ar_identical"] for r in pa["rows"] if r["mode"] == "ssv strict")
    # --lookup 2: the head's tree 2 nodes smaller, a chain of 2 from the context; greedy: ar's tokens
    succeeds(base[:base.index("--modes")] + ["--modes", "ssv strict lookup 2", "--lookup", 2, "--prompts", prompts,
                                             "--families", "code", "--temperatures", 0], capsys)
    lk = json.loads((tmp_path / "spec-cpu.json").read_text())
    assert {r["mode"] for r in lk["rows"]} == {"ar", "ssv strict lookup 2"}
    assert all(r["first_diff_vs_ar"] is None for r in lk["rows"])
    prof = json.loads((tmp_path / "profile-cpu.json").read_text())
    assert {e["strategy"]["name"]: e["strategy"]["lookup"] for es in prof["entries"] for e in es} == {"ssv strict lookup 2": 2}
    fails(base + ["--lookup", 6], capsys, "--lookup 6 leaves no head nodes")
    succeeds(base[:base.index("--modes")] + ["--modes", "ssv strict lookup 2", "--lookup", 2, "--prompts", prompts,
                                             "--families", "code", "--temperatures", 0, "--device-round"], capsys)
    dl = json.loads((tmp_path / "spec-cpu.json").read_text())   # the CPU's device round: the host round's rows
    # a tree of 13 past the 3x2 pool (11 nodes), whose head part (13 - 4) fits: only the modes run are checked
    succeeds(base[:base.index("--modes")] + ["--modes", "ssv strict lookup 4 compact", "--lookup", 4, "--lookup-compact",
                                             "--tree-tokens", 13, "--prompts", prompts, "--families", "code",
                                             "--temperatures", 0, "--device-round"], capsys)
    dc = json.loads((tmp_path / "spec-cpu.json").read_text())
    fails(base + ["--lookup", 2, "--lookup-compact", "--device-round", "--device", "cuda"], capsys,
          "--lookup-compact verifies rows that depend on the data")
    assert {r["mode"] for r in dc["rows"]} == {"ar", "ssv strict lookup 4 compact"}
    assert all(r["first_diff_vs_ar"] is None for r in dc["rows"])
    assert [(r["mode"], r["mean_accepted_length"], r["first_diff_vs_ar"]) for r in dl["rows"]] == [
        (r["mode"], r["mean_accepted_length"], r["first_diff_vs_ar"]) for r in lk["rows"]]
    # --device-round: the same rows through the DeviceEngine (greedy: the host round's MALs, ar's tokens)
    succeeds(base + ["--prompts", prompts, "--families", "code", "--temperatures", 0, "--device-round"], capsys)
    dr = json.loads((tmp_path / "spec-cpu.json").read_text())
    assert dr["args"]["device_round"] is True and all(r["first_diff_vs_ar"] is None for r in dr["rows"])
    host = {(s["family"], s["mode"]): s["mean_accepted_length"] for s in d["summary"] if s["temperature"] == 0.0}
    assert {(s["family"], s["mode"]): s["mean_accepted_length"] for s in dr["summary"]} == {
        k: v for k, v in host.items() if k[0] == "code"}
