import hashlib
import json

import torch

from ssv.draft import data, gen, load_eagle3
from ssv.draft.eagle3 import Eagle3Config
from ssv.draft.loop import init_head
from ssv.draft.teacher import Teacher
from ssv.draft.ttt import ttt_forward
from ssv.loaders import LoadedCheckpoint

from .helpers import tiny_target


def _sd(model):
    return {"model." + k: v.detach().clone() for k, v in model.state_dict().items()}


def test_hf_teacher_equals_ssv_target():
    target = tiny_target()
    hf = Teacher(target.cfg, _sd(target), (1, 2, 4))
    ref = Teacher(target.cfg, _sd(target), (1, 2, 4), backend="ssv")
    ids = torch.randint(3, 80, (2, 12))
    lengths = torch.tensor([12, 7])
    (f1, l1), (f2, l2) = hf.forward(ids, lengths), ref.forward(ids, lengths)
    for b, n in enumerate(lengths.tolist()):
        torch.testing.assert_close(f1[b, :n], f2[b, :n], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(l1[b, :n], l2[b, :n], rtol=1e-4, atol=1e-4)
    prompts = [[5, 6, 7], [8, 9, 10, 11]]
    assert hf.generate(prompts, 6, (2,)) == ref.generate(prompts, 6, (2,))


def test_training_decreases_loss():
    target = tiny_target(vocab=60)
    teacher = Teacher(target.cfg, _sd(target), (1, 2, 4))
    torch.manual_seed(0)
    seqs = [{"ids": torch.randint(3, 60, (n,)), "prompt_len": 4} for n in (24, 20, 17, 22)]
    ids, lengths, valid = gen.collate(seqs)
    assert int(valid.sum()) == sum(n - 4 for n in (24, 20, 17, 22))
    feats, logits = teacher.forward(ids, lengths)
    cfg = Eagle3Config.for_target(target.cfg, 40, window=8)
    head = init_head(cfg, torch.arange(40), _sd(target), True)
    opt = torch.optim.AdamW(head.parameters(), lr=3e-3)
    losses = []
    for _ in range(30):
        r = ttt_forward(head, teacher.embed_weight, feats, ids, logits, valid, steps=2)
        opt.zero_grad()
        r["loss"].backward()
        opt.step()
        losses.append(r["losses"])
    # soft CE is bounded below by the teacher's entropy: compare the excess (= KL) over it
    from ssv.draft.ttt import _shift, teacher_targets
    probs, _, mask = teacher_targets(head, logits, valid)
    ent = -(probs * probs.clamp_min(1e-30).log()).sum(-1)
    floor = [float((_shift(ent, k + 1) * _shift(mask, k + 1, False)).sum() / _shift(mask, k + 1, False).sum())
             for k in range(2)]
    for k in range(2):
        assert losses[-1][k] - floor[k] < 0.5 * (losses[0][k] - floor[k]), (k, losses[0], losses[-1], floor)


def test_collate_and_batches():
    seqs = [{"ids": torch.arange(5), "prompt_len": 3}, {"ids": torch.arange(3), "prompt_len": 1}]
    ids, lengths, valid = gen.collate(seqs)
    assert ids.shape == (2, 5) and lengths.tolist() == [5, 3]
    # teacher position p counts when token p+1 is an answer token
    assert valid.tolist() == [[False, False, True, True, False], [True, True, False, False, False]]
    b = gen.make_batches([10, 3, 7, 3, 9], batch_tokens=20, seed=0, epoch=0)
    assert sorted(i for x in b for i in x) == [0, 1, 2, 3, 4]
    assert all(len(x) * max([10, 3, 7, 3, 9][i] for i in x) <= 20 for x in b)
    assert b == gen.make_batches([10, 3, 7, 3, 9], 20, 0, 0)


def test_prompt_split_is_clean_and_deterministic(tmp_path):
    tr, ev = data.train_prompts(sources=("topics",)), data.eval_prompts(sources=("topics",))
    assert tr and ev
    assert not {p["split_key"] for p in tr} & {p["split_key"] for p in ev}
    assert [p["id"] for p in tr] == [p["id"] for p in data.train_prompts(sources=("topics",))]
    data.write_prompts(tmp_path / "e.jsonl", ev[:3])
    assert data.eval_prompts(path=tmp_path / "e.jsonl") == ev[:3]


def test_self_instruct_seeds_and_cleaning():
    seeds = data.self_seeds(300)
    assert len(seeds) == 300 and len({p["id"] for p in seeds}) == 300
    assert seeds == data.self_seeds(300)
    topics = {p["split_key"] for p in seeds}
    held = {p["split_key"] for p in seeds if data.is_eval(p["split_key"])}
    assert held and held < topics   # both sides of the split exist
    assert data.clean_question('  "Question: Why do cats purr?"  ') == "Why do cats purr?"
    assert data.clean_question('A student might ask: "What is coffee, and how does it affect sleep?') == \
        "What is coffee, and how does it affect sleep?"
    assert data.clean_question('Ask "Why is the sea salty?" and "Why is it blue?"') == "Why is the sea salty?"
    assert data.clean_question('What is "machine learning" used for?') == 'What is "machine learning" used for?'
    assert data.clean_question('What does "carpe diem" mean in Latin?') == 'What does "carpe diem" mean in Latin?'
    assert data.clean_question("Why?") is None
    assert data.clean_question("How do bees make honey?\n\nBees collect nectar...") == "How do bees make honey?"


def test_raw_documents_split_cap_and_shards(tmp_path):
    class tok:  # noqa: N801 -- invertible stand-in tokenizer
        encode = staticmethod(lambda text: [ord(c) for c in text])

    tr = data.raw_documents(tok, "train", seq_len=64, max_tokens=1000)
    ev = data.raw_documents(tok, "eval", seq_len=64, max_tokens=1000, min_len=16)
    # the cap is kept, and a piece cut shorter than min_len by it is dropped
    assert 1000 - 64 < sum(map(len, tr)) <= 1000 and 1000 - 16 < sum(map(len, ev)) <= 1000
    assert all(16 <= len(p) <= 64 for p in ev) and max(map(len, tr)) == 64
    assert tr == data.raw_documents(tok, "train", seq_len=64, max_tokens=1000)   # deterministic
    # the two sides come from different files (the first piece of each file names it)
    def names(ps):
        text = "".join(chr(c) for p in ps for c in p)
        return {line for line in text.splitlines() if line.startswith("# file: ")}
    assert names(tr) and names(ev) and not names(tr) & names(ev)
    gen.write_raw_split(tmp_path, "train", tr, shard=7)
    (tmp_path / "train.done").write_text("0\n")
    back = gen.load_split(tmp_path, "train")
    assert [s["ids"].tolist() for s in back] == tr and all(s["prompt_len"] == 0 for s in back)
    ids, lengths, valid = gen.collate(back[:2])
    assert valid[0, :63].all() and not valid[0, 63]   # every position has a next-token label
    (tmp_path / "train_raw.done").unlink()
    try:
        gen.load_split(tmp_path, "train")
        raise AssertionError("incomplete pieces were loaded")
    except FileNotFoundError as e:
        assert "incomplete" in str(e)
    try:
        data.raw_documents(tok, "test", 64, 10)
        raise AssertionError("bad split accepted")
    except ValueError as e:
        assert "split" in str(e)


class _CharTok:
    """Stand-in tokenizer: one id per character."""
    eos_ids = (2,)

    def encode(self, text):
        return [3 + ord(c) % 70 for c in text]

    def decode(self, ids, skip_special_tokens=False):
        return "".join(chr(ord("a") + t % 26) for t in ids)

    def encode_chat(self, messages, add_generation_prompt=True):
        return [1] + [3 + ord(c) % 70 for c in messages[-1]["content"]] + [2, 1]


def test_train_draft_pipeline_resume_and_export(tmp_path, monkeypatch):
    import ssv.loaders
    from ssv.draft.train import EXIT_RESUME, main

    target = tiny_target()
    ck = LoadedCheckpoint(target.cfg, _sd(target), _CharTok(), "tiny")
    monkeypatch.setattr(ssv.loaders, "load_checkpoint", lambda spec, **kw: ck)
    run, out = tmp_path / "run", tmp_path / "head"
    common = ["--run-dir", str(run), "--device", "cpu", "--num-prompts", "6", "--eval-prompts", "2",
              "--sources", "topics", "--max-prompt-tokens", "24", "--max-new-tokens", "8", "--gen-batch", "4",
              "--seq-len", "40", "--draft-vocab", "30", "--window", "16", "--ttt-steps", "2", "--epochs", "3",
              "--batch-tokens", "80", "--warmup", "1", "--save-every", "2", "--eval-every", "3",
              "--raw-tokens", "200", "--raw-eval-tokens", "80", "--self-prompts", "12", "--log-every", "1"]
    assert main(common + ["--time-budget", "1e-9"]) == EXIT_RESUME   # stops before generating anything
    assert not (run / "data" / "train.done").exists()
    assert main(common + ["--max-steps", "3"]) == 0
    own = data.read_prompts(run / "prompts_self.jsonl")   # the target's own questions, split by topic
    assert own and all(p["kind"] == "self" and p["text"] for p in own)
    train_ids = {p["id"] for p in data.read_prompts(run / "prompts_train.jsonl")}
    assert {p["id"] for p in own if not data.is_eval(p["split_key"])} <= train_ids
    assert not {p["id"] for p in own if data.is_eval(p["split_key"])} & train_ids
    raw = [s for s in gen.load_split(run / "data", "train") if s["prompt_len"] == 0]
    assert sum(s["ids"].numel() for s in raw) == 200   # the plain-source pieces train beside the answers
    st = torch.load(run / "state.pt", weights_only=False)
    assert st["step"] == 3
    assert main(common + ["--max-steps", "5", "--export", str(out)]) == 0      # resumes from step 3
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["kind"] == "train"] == [1, 2, 3, 4, 5]
    head, cfg = load_eagle3(out, target=target.cfg)
    assert cfg.draft_vocab_size == 30 and cfg.window == 16
    assert (out / "eval_prompts.jsonl").read_text() == (run / "eval_prompts.jsonl").read_text()
    assert main(common[:-2] + ["--log-every", "1", "--draft-vocab", "20"]) == 2   # settings changed: refused

    # --init-from: a new run starts from the exported head (its weights and draft vocabulary); at lr 0
    # its export is that head again, and a head that does not match the run is refused before any work
    run2, out2 = tmp_path / "run2", tmp_path / "head2"
    from2 = [a if a != str(run) else str(run2) for a in common] + ["--init-from", str(out)]
    assert main(from2 + ["--max-steps", "1", "--lr", "0"]) == 0
    assert main(from2 + ["--max-steps", "2", "--lr", "0", "--export", str(out2)]) == 0   # resumed from state.pt
    rows2 = [json.loads(x) for x in (run2 / "metrics.jsonl").read_text().splitlines()]
    evals = [r["step"] for r in rows2 if r["kind"] == "eval"]
    assert evals[0] == 0 and evals.count(0) == 1           # the starting head evaluated once, not on resume
    digest = hashlib.sha256((out / "model.safetensors").read_bytes()).hexdigest()
    assert json.loads((run2 / "run.json").read_text())["init_from_sha256"] == digest
    head2, _ = load_eagle3(out2, target=target.cfg)
    assert torch.equal(head2.target_ids(), head.target_ids())
    sd, sd2 = head.state_dict(), head2.state_dict()
    assert all(torch.equal(sd[k], sd2[k]) for k in sd)
    run3 = tmp_path / "run3"
    bad = [a if a != str(run) else str(run3) for a in common] + ["--init-from", str(out)]
    bad[bad.index("--draft-vocab") + 1] = "20"
    assert main(bad) == 2 and not (run3 / "data").exists() and not (run3 / "run.json").exists()
    bad[bad.index("--draft-vocab") + 1] = "30"              # a refused run leaves nothing that refuses the retry
    assert main(bad + ["--max-steps", "1"]) == 0

    # a larger --draft-vocab grows the starting head: its ids and rows kept, the most frequent answer
    # tokens it lacks added (at lr 0 the export is the grown head)
    run4, out4 = tmp_path / "run4", tmp_path / "head4"
    grow = [a if a != str(run) else str(run4) for a in common] + ["--init-from", str(out)]
    grow[grow.index("--draft-vocab") + 1] = "36"
    assert main(grow + ["--max-steps", "1", "--lr", "0", "--export", str(out4)]) == 0
    head4, cfg4 = load_eagle3(out4, target=target.cfg)
    assert cfg4.draft_vocab_size == 36
    ids4 = head4.target_ids()
    keep = torch.searchsorted(ids4, head.target_ids())
    assert torch.equal(ids4[keep], head.target_ids())
    torch.testing.assert_close(head4.lm_head.weight[keep], head.lm_head.weight, rtol=0, atol=1e-2)  # bf16 export
    counts = torch.load(run4 / "vocab.pt", weights_only=True)["counts"]
    added = ids4[~torch.isin(ids4, head.target_ids())]
    others = torch.ones_like(counts, dtype=torch.bool)
    others[ids4] = False
    assert counts[added].min() >= counts[others].max()      # the most frequent of the missing ones

    # --balanced-vocab with --init-from: the vocabulary chosen anew, each data group (the answers to the
    # target's own questions, the other answers, the document pieces) weighing equally; the rows of ids
    # the start has are kept (lr 0), the others mapped from the target's output layer
    run5, out5 = tmp_path / "run5", tmp_path / "head5"
    rev = [a if a != str(run) else str(run5) for a in common] + ["--init-from", str(out), "--balanced-vocab"]
    assert main(rev + ["--max-steps", "1", "--lr", "0", "--export", str(out5)]) == 0
    head5, cfg5 = load_eagle3(out5, target=target.cfg)
    assert cfg5.draft_vocab_size == 30
    from ssv.draft.loop import vocab_groups
    from ssv.draft.vocab import balanced_scores, top_tokens
    groups = vocab_groups(gen.load_split(run5 / "data", "train"), target.cfg.vocab_size)
    assert all(int(c.sum()) > 0 for c in groups.values())        # three non-empty groups in this run
    ids5 = head5.target_ids()
    assert torch.equal(ids5, top_tokens(balanced_scores(list(groups.values())), 30))
    assert not torch.equal(ids5, head.target_ids())               # the balance changed the choice
    both = torch.isin(ids5, head.target_ids())
    assert 0 < int(both.sum()) < 30
    old_rows = head.lm_head.weight[torch.searchsorted(head.target_ids(), ids5[both])]
    torch.testing.assert_close(head5.lm_head.weight[both], old_rows, rtol=0, atol=1e-2)   # bf16 export
    assert torch.isfinite(head5.lm_head.weight).all()
    assert torch.load(run5 / "vocab.pt", weights_only=True)["balanced"] is True


def test_train_draft_refuses_a_negative_time_budget(tmp_path, capsys):
    import pytest

    from ssv.cli import main as ssv_main
    for bad in ("-5", "nan"):
        with pytest.raises(SystemExit) as e:
            ssv_main(["train-draft", "--run-dir", str(tmp_path / "run"), "--time-budget", bad])
        assert e.value.code == 2
        assert f"--time-budget must be >= 0 seconds (0: none), got {float(bad)}" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()   # refused before anything was made
