import gzip
import json
from pathlib import Path

import pytest

from ssv.draft import corpus, data, gen
from ssv.loaders import LoadedCheckpoint

from .helpers import tiny_target
from .test_train import _CharTok, _sd


def test_banned_paths_and_licence_paragraphs():
    for p in ("/usr/share/common-licenses/GPL-3", "/usr/share/doc/foo/copyright", "/usr/share/doc/foo/COPYING",
              "/usr/share/doc/foo/LICENSE.txt", "/usr/share/man/man1/perlfaq.1.gz", "/usr/share/perl5/x/README",
              "/usr/share/info/bash.info.gz", "/usr/share/doc/x/manual.info", "/usr/lib/x/Foo.pm"):
        assert corpus.banned(Path(p)), p
    for p in ("/usr/share/man/man1/ls.1.gz", "/usr/share/doc/curl/README.md", "/usr/include/stdio.h"):
        assert not corpus.banned(Path(p)), p
    text = ("Intro paragraph.\n\nThis program is free software; see the GNU General Public License.\n\n"
            "Copyright (C) 2020 Someone\n\nNO WARRANTY of any kind.\n\n(c) 2021 X\n\nLast words.")
    assert corpus.strip_licences(text) == "Intro paragraph.\n\nLast words."


def test_held_out_rule_and_hash_split():
    git = corpus._doc("man", "git-rebase.1", "x" * 500)
    assert git["split"] == "eval"                                 # the benchmarks' pages: never trained on
    assert corpus._doc("doc", "git/RelNotes/2.0.txt", "x" * 500)["split"] == "eval"
    assert corpus._doc("man", "ls.1", "short") is None             # too short (or licence-only) documents go
    splits = {corpus._doc("man", f"tool{i}.1", "y" * 500)["split"] for i in range(200)}
    assert splits == {"train", "eval"}                             # the hash split, like data.is_eval
    d = corpus._doc("c", "sys/x.h", "z" * 500)
    assert d["split"] == ("eval" if data.is_eval("c:sys/x.h") else "train")


def _docs():
    docs = []
    for fam in corpus.FAMILIES:
        for i in range(6):
            d = corpus._doc(fam, f"{fam}-file{i}", f"{fam} document {i}. " * 40)
            docs.append(d)
    docs.append(corpus._doc("man", "git-tag.1", "held out page. " * 40))
    return docs


def test_write_read_roundtrip_and_errors(tmp_path):
    docs = _docs()
    corpus.write_corpus(tmp_path / "a.jsonl.xz", docs[::2])
    corpus.write_corpus(tmp_path / "b.jsonl.xz", docs[1::2])
    back = corpus.read_corpus([tmp_path / "b.jsonl.xz", tmp_path / "a.jsonl.xz"])
    assert back == sorted(docs, key=lambda d: d["id"])             # parts in any order, one corpus
    with pytest.raises(FileNotFoundError, match="corpus file not found"):
        corpus.read_corpus(tmp_path / "missing.jsonl.xz")
    bad = dict(docs[0], family="perl")
    corpus.write_corpus(tmp_path / "bad.jsonl.xz", [bad])
    with pytest.raises(ValueError, match="unknown family or split"):
        corpus.read_corpus(tmp_path / "bad.jsonl.xz")


def test_stream_pieces_and_family_shares():
    tok = _CharTok()
    docs = _docs()
    pieces = corpus.stream_pieces(tok, docs, seq_len=100, max_tokens=1000)
    assert len(pieces) == 10 and all(len(p) == 100 for p in pieces)   # full pieces, the cap kept
    stream = [t for d in docs for t in tok.encode(d["text"] + "\n\n")]
    assert [t for p in pieces for t in p] == stream[:1000]          # documents concatenated in order
    tr = corpus.corpus_pieces(tok, docs, "train", 50, 800, shares={"man": 0.5, "c": 0.5})
    assert sum(map(len, tr)) <= 800 and tr
    ev = corpus.corpus_pieces(tok, docs, "eval", 50, 10_000, shares={"man": 1.0})
    held = "".join(d["text"] + "\n\n" for d in sorted((d for d in docs if d["family"] == "man" and d["split"] == "eval"),
                                                       key=lambda d: (corpus._h("stream:" + d["id"]), d["id"])))
    assert [t for p in ev for t in p] == tok.encode(held)[: len(ev) * 50]


def test_corpus_prompts_keep_the_split():
    docs = _docs()
    tr, ev = corpus.corpus_prompts(docs, "train", 1000), corpus.corpus_prompts(docs, "eval", 1000)
    keys_tr, keys_ev = {p["split_key"] for p in tr}, {p["split_key"] for p in ev}
    assert tr and ev and not keys_tr & keys_ev
    assert "man:git-tag.1" in keys_ev
    assert {p["kind"] for p in tr} <= set(corpus.FAMILIES)
    code = next(p for p in tr + ev if p["kind"] in ("c", "sh"))
    assert "code" in code["text"] or "file" in code["text"]
    assert len(corpus.corpus_prompts(docs, "train", 3)) == 3


def test_render_man_and_collect_on_a_fake_machine(tmp_path, monkeypatch):
    man = tmp_path / "man" / "man1"
    man.mkdir(parents=True)
    page = ".TH DEMO 1\n.SH NAME\ndemo \\- a demo tool\n.SH DESCRIPTION\n" + "Demo does things. " * 60 + "\n"
    with gzip.open(man / "demo.1.gz", "wt") as f:
        f.write(page)
    with gzip.open(man / "perltoot.1.gz", "wt") as f:
        f.write(page)
    doc = tmp_path / "doc" / "demo"
    doc.mkdir(parents=True)
    (doc / "README.md").write_text("# Demo\n\n" + "Read me please. " * 60)
    (doc / "copyright").write_text("Copyright 2020. " * 60)
    inc = tmp_path / "include"
    inc.mkdir()
    (inc / "demo.h").write_text("/* Licensed under the MIT License */\n\n" + "int demo(void);\n" * 40)
    monkeypatch.setattr(corpus, "MAN_ROOT", tmp_path / "man")
    monkeypatch.setattr(corpus, "DOC_ROOT", tmp_path / "doc")
    monkeypatch.setattr(corpus, "INCLUDE_ROOT", inc)
    monkeypatch.setattr(corpus, "SCRIPT_ROOTS", ())
    try:
        rendered = corpus.render_man(man / "demo.1.gz")
    except FileNotFoundError:
        rendered = ""
    if not rendered:
        pytest.skip("man(1) is not installed")
    assert "Demo does things." in rendered
    docs = corpus.collect(workers=1, log=lambda m: None)
    ids = {d["id"] for d in docs}
    assert ids == {"man:demo.1", "doc:demo/README.md", "c:demo.h"}   # no perl page, no copyright file
    assert all(not corpus._LICENCE.search(d["text"]) for d in docs)


def test_train_draft_with_a_corpus(tmp_path, monkeypatch, capsys):
    import ssv.loaders
    from ssv.draft.train import main

    target = tiny_target()
    ck = LoadedCheckpoint(target.cfg, _sd(target), _CharTok(), "tiny")
    monkeypatch.setattr(ssv.loaders, "load_checkpoint", lambda spec, **kw: ck)
    corpus.write_corpus(tmp_path / "c.jsonl.xz", _docs())
    run = tmp_path / "run"
    args = ["--run-dir", str(run), "--device", "cpu", "--num-prompts", "2", "--eval-prompts", "4",
            "--sources", "topics", "--max-prompt-tokens", "24", "--max-new-tokens", "4", "--gen-batch", "8",
            "--seq-len", "40", "--draft-vocab", "30", "--window", "16", "--ttt-steps", "1", "--epochs", "1",
            "--batch-tokens", "80", "--warmup", "1", "--eval-every", "0", "--max-steps", "2",
            "--corpus", str(tmp_path / "c.jsonl.xz"), "--corpus-prompts", "5", "--corpus-tokens", "400",
            "--corpus-eval-tokens", "80"]
    assert main(args) == 0
    prompts = data.read_prompts(run / "prompts_train.jsonl")
    assert sum(p["kind"] in corpus.FAMILIES for p in prompts) == 5
    ev = data.read_prompts(run / "eval_prompts.jsonl")
    assert {p["split_key"] for p in ev if p["kind"] in corpus.FAMILIES} <= {
        d["split_key"] for d in _docs() if d["split"] == "eval"}
    raw = [s for s in gen.load_split(run / "data", "train") if s["prompt_len"] == 0]
    assert 0 < sum(s["ids"].numel() for s in raw) <= 400 and all(s["ids"].numel() == 40 for s in raw)
    raw_ev = [s for s in gen.load_split(run / "data", "eval") if s["prompt_len"] == 0]
    assert 40 <= sum(s["ids"].numel() for s in raw_ev) <= 80   # the held-out git page, one 40-token piece
    capsys.readouterr()
    assert main(["--run-dir", str(tmp_path / "r2"), "--device", "cpu", "--corpus-tokens", "10"]) == 2
    assert "need --corpus" in capsys.readouterr().err
    assert main(["--run-dir", str(tmp_path / "r3"), "--device", "cpu", "--corpus", str(tmp_path / "no.xz")]) == 2
    assert "corpus file not found" in capsys.readouterr().err
    assert not (tmp_path / "r2").exists() and not (tmp_path / "r3").exists()   # refused before any work
    json.loads((run / "run.json").read_text())["corpus"]  # recorded: a resumed run must keep it
