"""`ssv` command line: bad input gives exit code 2 and a specific message; happy paths print JSON.

Error cases run on a tiny random Hugging Face Llama checkpoint written here (context 64, word-level
tokenizer) so they are fast; happy paths run the default model (loaded once per session).
"""
from __future__ import annotations

import json
import math
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import ssv.cli as cli
from ssv.cli import main
from ssv.engine.generate import generate_ar, perplexity
from ssv.engine.runner import Runner
from ssv.spec.accept import SamplingParams

WORDS = ("the a cat dog sat on mat and ran to house big small red blue green it is was very "
         "user assistant hello world").split()
TINY_CONTEXT = 64


def fresh_seed() -> int:
    return random.SystemRandom().randrange(2**31)


@pytest.fixture(scope="module")
def tiny_ckpt(tmp_path_factory, word_tokenizer):
    """A random Llama in Hugging Face layout with max_position_embeddings 64 and a word-level tokenizer."""
    from transformers import LlamaConfig, LlamaForCausalLM

    folder = tmp_path_factory.mktemp("tiny_hf")
    n_vocab = word_tokenizer(folder, WORDS, bos_post_processor=False, eos_token="</s>", add_bos_token=False,
                             chat_template="{% for m in messages %}{{ m['role'] }} {{ m['content'] }} {% endfor %}"
                                           "{% if add_generation_prompt %}assistant {% endif %}")
    torch.manual_seed(fresh_seed())
    cfg = LlamaConfig(vocab_size=n_vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=TINY_CONTEXT,
                      bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)
    LlamaForCausalLM(cfg).save_pretrained(str(folder))
    return folder


def words_file(folder: Path, n: int, name: str = "prompt.txt") -> Path:
    rng = random.Random(fresh_seed())
    p = folder / name
    p.write_text(" ".join(rng.choice(WORDS[:-4]) for _ in range(n)), encoding="utf-8")
    return p


def fails(argv, capsys, *patterns):
    """main(argv) must exit with code 2, print nothing on stdout and `ssv: error: ...` naming every pattern."""
    with pytest.raises(SystemExit) as e:
        main([str(a) for a in argv])
    assert e.value.code == 2, e.value.code
    out, err = capsys.readouterr()
    assert out == "", out
    assert "Traceback" not in err
    for p in patterns:
        assert p in err, f"{p!r} not in {err!r}"
    return err


def succeeds(argv, capsys):
    assert main([str(a) for a in argv]) == 0
    return capsys.readouterr()


@pytest.fixture
def fast_default(monkeypatch, default_model):
    """Route `--model default` (cpu, fp32) to the session's already-loaded default model."""
    real = cli.load_model
    calls = []

    def load(spec, device, dtype=None, progress=True):
        calls.append(spec)
        if spec == "default" and device == "cpu" and dtype in (None, "float32"):
            return default_model
        return real(spec, device, dtype, progress)

    monkeypatch.setattr(cli, "load_model", load)
    return calls


# ============================================================================ bad input: generate
def test_missing_model_path(capsys, tmp_path):
    missing = tmp_path / "no" / "such" / "model"
    fails(["generate", "--model", missing, "--prompt", "hi"], capsys, "checkpoint path does not exist", str(missing))
    fails(["ppl", "--model", missing, "--file", words_file(tmp_path, 10), "--context", 4], capsys,
          "checkpoint path does not exist")
    not_gguf = tmp_path / "weights.bin"
    not_gguf.write_bytes(b"\0" * 16)
    fails(["generate", "--model", not_gguf, "--prompt", "hi"], capsys, "is a file but not a .gguf")


def test_prompt_longer_than_context(capsys, tiny_ckpt, tmp_path):
    big = words_file(tmp_path, 5000)
    fails(["generate", "--model", tiny_ckpt, "--prompt-file", big, "--no-chat"], capsys,
          "prompt of 5000 tokens leaves no room in the context limit of 64 tokens")
    # exactly at the limit: no room left for the next token either
    fails(["generate", "--model", tiny_ckpt, "--prompt-file", words_file(tmp_path, 64), "--no-chat"], capsys,
          "prompt of 64 tokens leaves no room in the context limit of 64 tokens")
    # one less fits: one token is generated, then the context stops generation
    out, _ = succeeds(["generate", "--model", tiny_ckpt, "--prompt-file", words_file(tmp_path, 63), "--no-chat",
                       "--json", "--max-new-tokens", 5], capsys)
    res = json.loads(out)
    assert len(res["token_ids"]) == 1 and res["stats"]["prompt_tokens"] == 63
    assert res["stats"]["stop"] in ("context", "eos")


@pytest.mark.parametrize("prompt", ["", "   ", " \n\t "])
def test_empty_prompt(capsys, tiny_ckpt, tmp_path, prompt):
    fails(["generate", "--model", tiny_ckpt, "--prompt", prompt], capsys, "empty prompt")
    f = tmp_path / "empty.txt"
    f.write_text(prompt, encoding="utf-8")
    fails(["generate", "--model", tiny_ckpt, "--prompt-file", f], capsys, "empty prompt")


def test_prompt_sources(capsys, tiny_ckpt, tmp_path):
    f = words_file(tmp_path, 5)
    fails(["generate", "--model", tiny_ckpt, "--prompt", "the cat", "--prompt-file", f], capsys,
          "give either --prompt or --prompt-file, not both")
    missing = tmp_path / "nope.txt"
    fails(["generate", "--model", tiny_ckpt, "--prompt-file", missing], capsys, "prompt file not found", str(missing))
    fails(["generate", "--model", tiny_ckpt], capsys, "no prompt: give --prompt TEXT or --prompt-file F")


def test_generate_refuses_bad_options_before_loading_the_model(capsys, monkeypatch, tmp_path):
    """Option errors cost no model load (seconds on the CPU): each is refused with load_model unreachable."""
    def no_load(*a, **k):
        raise AssertionError("the model was loaded before the options were checked")
    monkeypatch.setattr(cli, "load_model", no_load)
    base = ["generate", "--model", tmp_path / "no-model", "--max-new-tokens", 4]
    fails(base + ["--prompt", "  "], capsys, "empty prompt")
    fails(base + ["--prompt-file", tmp_path / "nope.txt"], capsys, "prompt file not found")
    fails(base, capsys, "no prompt")
    fails(base + ["--prompt", "hi", "--max-new-tokens", 0], capsys, "--max-new-tokens")
    fails(base + ["--prompt", "hi", "--temperature", -1], capsys, "temperature")
    spec = base + ["--prompt", "hi", "--mode", "ssv"]
    fails(spec + ["--tree-depth", 0], capsys, "depth")
    fails(spec + ["--tree-topk", 100], capsys, "top_k")
    fails(spec + ["--group-size", 3], capsys, "group size")
    fails(spec + ["--refresh-every", 2], capsys, "approx")
    fails(spec + ["--lookup", 17], capsys, "lookup must be an int in [0, 16]")
    fails(spec + ["--tree-tokens", 129, "--tree-depth", 8, "--tree-topk", 16], capsys, "128")
    fails(spec + ["--draft", tmp_path / "no-head"], capsys, "EAGLE-3 head folder not found", "no-head")
    fails(spec + ["--profile", tmp_path / "p.json"], capsys, "profile not found")
    fails(base + ["--prompt", "hi", "--mode", "sd-naive", "--profile", tmp_path / "p.json"], capsys,
          "--profile does not apply to --mode sd-naive")
    # options that pass the check reach the load: the same command with a good tree loads (and fails here)
    with pytest.raises(AssertionError, match="the model was loaded"):
        main([str(a) for a in spec + ["--tree-depth", 2, "--tree-topk", 2, "--tree-tokens", 4]])
    hi = base + ["--prompt", "hi"]
    fails(hi + ["--seed", 2 ** 64], capsys, "--seed must be in [-2^63, 2^64)")
    fails(hi + ["--seed", -2 ** 63 - 1], capsys, "--seed must be in [-2^63, 2^64)")
    fails(hi + ["--record-routing", tmp_path], capsys, "--record-routing", "is a folder")
    fails(base + ["--prompt-file", tmp_path], capsys, "is a folder, not a text file")
    latin = tmp_path / "latin1.txt"
    latin.write_bytes("caf\xe9 cr\xe8me".encode("latin-1"))
    fails(base + ["--prompt-file", latin], capsys, "latin1.txt is not UTF-8 text")
    # a flag the mode does not read is refused, not ignored
    for flags, name in (([ "--tree-depth", 2], "--tree-depth"), (["--lookup", 3], "--lookup"),
                        (["--draft", tmp_path], "--draft"), (["--profile", tmp_path / "p.json"], "--profile"),
                        (["--no-fallback"], "--no-fallback"), (["--group-size", 8], "--group-size"),
                        (["--precision", "approx"], "--precision"), (["--traversal", "bfs"], "--traversal")):
        fails(hi + flags, capsys, f"{name} does not apply to --mode ar")
    for flags, name in ((["--group-size", 8], "--group-size"), (["--precision", "approx"], "--precision"),
                        (["--refresh-every", 2], "--refresh-every"), (["--no-fallback"], "--no-fallback")):
        fails(hi + ["--mode", "sd-naive"] + flags, capsys, f"{name} does not apply to --mode sd-naive")
    # the root alone drafts nothing (with a lookup the chain is the draft); a device round keeps exactly the
    # tree's nodes, so a pool smaller than the tree is refused here, not after the prefill
    fails(spec + ["--tree-tokens", 1], capsys, "root alone")
    fails(spec + ["--tree-depth", 2, "--tree-topk", 1, "--tree-tokens", 48], capsys, "exceeds its candidate pool of 3")
    for ok in (["--tree-tokens", 1, "--lookup", 3], ["--tree-depth", 2, "--tree-topk", 1, "--tree-tokens", 48,
                                                    "--host-round"]):
        with pytest.raises(AssertionError, match="the model was loaded"):
            main([str(a) for a in spec + ok])
    words = words_file(tmp_path, 50)
    fails(["ppl", "--model", tmp_path / "no-model", "--file", words, "--context", 32, "--score-from", 32], capsys,
          "--score-from must be in [1, 31]")
    fails(["ppl", "--model", tmp_path / "no-model", "--file", words, "--context", 32, "--score-from", 0], capsys,
          "--score-from must be in [1, 31]")


def test_bench_spec_refuses_bad_options_before_loading_the_model(capsys, monkeypatch, tmp_path):
    def no_load(*a, **k):
        raise AssertionError("the model was loaded before the options were checked")
    monkeypatch.setattr(cli, "load_model", no_load)
    base = ["bench", "spec", "--device", "cpu", "--out", tmp_path]
    fails(base + ["--docs", 0], capsys, "--docs must be >= 1, got 0")
    fails(base + ["--docs", -1], capsys, "--docs must be >= 1, got -1")
    fails(base + ["--contexts", 0], capsys, "--contexts must be positive token counts, got 0")
    fails(base + ["--contexts", 1024, -5], capsys, "--contexts must be positive token counts, got -5")
    fails(base + ["--modes", "ssv stirct"], capsys, "unknown mode 'ssv stirct'", "'ssv strict'", "'ar'")
    fails(base + ["--modes", "ssv strict lookup 4"], capsys, "unknown mode 'ssv strict lookup 4'")
    for ok in (["--modes", "ar", "ssv strict"], ["--lookup", 4, "--modes", "ssv strict lookup 4"],
               ["--extra-trees", "2,2,4", "--modes", "ssv strict tree 2x2x4"]):
        with pytest.raises(AssertionError, match="the model was loaded"):
            main([str(a) for a in base + ok])
    assert not any(tmp_path.iterdir())   # nothing written


def test_generate_says_when_the_context_stops_it(capsys, tiny_ckpt, tmp_path):
    argv = ["generate", "--model", tiny_ckpt, "--prompt-file", words_file(tmp_path, 62), "--no-chat",
            "--max-new-tokens", 8]
    stop = json.loads(succeeds(argv + ["--json"], capsys).out)["stats"]["stop"]
    assert stop in ("context", "eos")   # (the random model's greedy text may end first)
    _, err = succeeds(argv, capsys)
    assert ("note: stopped at the context limit of 64 tokens after" in err and "(the prompt has 62)" in err) \
        == (stop == "context")
    _, err = succeeds(["generate", "--model", tiny_ckpt, "--prompt", "the cat", "--no-chat", "--max-new-tokens", 2],
                      capsys)
    assert "context limit" not in err


@pytest.mark.parametrize("value", ["-0.5", "-1e-9", "nan", "inf"])
def test_bad_temperature(capsys, value):
    # rejected before any model is loaded (the model path does not exist)
    fails(["generate", "--model", "/nonexistent", "--prompt", "hi", f"--temperature={value}"], capsys,
          "--temperature must be a finite number >= 0")


@pytest.mark.parametrize("value", ["0", "1.5", "-0.1"])
def test_bad_top_p(capsys, value):
    fails(["generate", "--model", "/nonexistent", "--prompt", "hi", f"--top-p={value}"], capsys,
          "--top-p must be in (0, 1]")


@pytest.mark.parametrize("value", ["0", "-3"])
def test_bad_max_new_tokens(capsys, value):
    fails(["generate", "--model", "/nonexistent", "--prompt", "hi", f"--max-new-tokens={value}"], capsys,
          f"--max-new-tokens must be >= 1, got {value}")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_without_cuda(capsys, tiny_ckpt, tmp_path):
    fails(["generate", "--model", tiny_ckpt, "--prompt", "hi", "--device", "cuda"], capsys,
          "--device cuda requested but no CUDA device is available")
    fails(["ppl", "--model", tiny_ckpt, "--file", words_file(tmp_path, 100), "--context", 32, "--device", "cuda"],
          capsys, "--device cuda requested but no CUDA device is available")


def test_argparse_rejections(capsys):
    with pytest.raises(SystemExit) as e:
        main(["generate", "--attention", "sparse", "--prompt", "hi"])
    assert e.value.code == 2 and "invalid choice: 'sparse'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["generate", "--max-new-tokens", "ten", "--prompt", "hi"])
    assert e.value.code == 2 and "invalid int value: 'ten'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["ppl"])
    assert e.value.code == 2 and "--file" in capsys.readouterr().err


# ============================================================================ bad input: ppl
def test_ppl_bad_input(capsys, tiny_ckpt, tmp_path):
    missing = tmp_path / "missing.txt"
    fails(["ppl", "--model", tiny_ckpt, "--file", missing], capsys, "text file not found", str(missing))
    short = words_file(tmp_path, 20, "short.txt")
    fails(["ppl", "--model", tiny_ckpt, "--file", short, "--context", 32], capsys,
          "short.txt has 20 tokens, fewer than --context 32")
    fails(["ppl", "--model", tiny_ckpt, "--file", short, "--context", 1], capsys, "--context must be >= 2, got 1")
    long = words_file(tmp_path, 300, "long.txt")
    fails(["ppl", "--model", tiny_ckpt, "--file", long, "--context", 100], capsys,
          "100 tokens exceed the context limit of 64")
    fails(["ppl", "--model", tiny_ckpt, "--file", long, "--context", 32, "--score-from", 32], capsys,
          "--score-from must be in [1, 31] (below --context), got 32")
    # and a valid call on the same model works
    out, _ = succeeds(["ppl", "--model", tiny_ckpt, "--file", long, "--context", 64, "--json"], capsys)
    res = json.loads(out)
    assert res["tokens"] == 32 and res["context"] == 64 and math.isfinite(res["perplexity"])


def test_ppl_default_model_file_shorter_than_default_context(capsys, fast_default, tmp_path):
    f = tmp_path / "note.txt"
    f.write_text("A short note, far fewer than four thousand tokens.", encoding="utf-8")
    fails(["ppl", "--file", f], capsys, "note.txt has", "fewer than --context 4096")


# ============================================================================ nothing left half-done
def test_runner_usable_after_errors(tiny_model):
    model = tiny_model(fresh_seed(), max_seq_len=64)
    runner = Runner(model, attention="nsa", scratch=16)
    g = torch.Generator().manual_seed(fresh_seed())
    prompt = torch.randint(3, 97, (20,), generator=g).tolist()
    params = SamplingParams(0.0)
    first = generate_ar(runner, prompt, params, 8).token_ids
    for bad in ([5] * 64, [5] * 200, [], [5, model.cfg.vocab_size], [-5, 3]):
        with pytest.raises(ValueError):
            generate_ar(runner, bad, params, 8)
    with pytest.raises(ValueError, match=f"prompt token id {model.cfg.vocab_size} is outside the vocabulary"):
        runner.prefill([5, model.cfg.vocab_size])
    with pytest.raises(ValueError, match=r"prompt token id -5 is outside the vocabulary \[0, "):
        runner.prefill(torch.tensor([-5, 3]))
    assert generate_ar(runner, prompt, params, 8).token_ids == first
    with pytest.raises(ValueError, match="max_new_tokens must be >= 1"):
        generate_ar(runner, prompt, params, 0)

    # a failed prefill in the middle of a sequence commits nothing and keeps the cache intact
    runner.reset()
    runner.prefill(prompt[:12])
    snap = (runner.cache.k[:, :, :12].clone(), runner.cache.k_cmp.clone(), runner.cache.n_cmp)
    with pytest.raises(ValueError, match="does not fit the context limit of 64 tokens"):
        runner.prefill([7] * 60)
    with pytest.raises(ValueError, match="empty prompt"):
        runner.prefill([])
    assert runner.length == 12 and runner.cache.n_cmp == snap[2]
    assert torch.equal(runner.cache.k[:, :, :12], snap[0]) and torch.equal(runner.cache.k_cmp, snap[1])
    last, _ = runner.prefill(prompt[12:])
    fresh = Runner(model, attention="nsa", scratch=16)
    want, _ = fresh.prefill(prompt)
    torch.testing.assert_close(last, want, atol=1e-5, rtol=1e-5)

    # perplexity: rejected input leaves the runner usable
    ids = torch.randint(3, 97, (64,), generator=g).tolist()
    ok = perplexity(runner, ids, 32)
    with pytest.raises(ValueError, match="exceed the context limit"):
        perplexity(runner, ids + [5], 32)
    assert perplexity(runner, ids, 32) == ok


def test_cli_error_then_success_in_one_process(capsys, tiny_ckpt, tmp_path):
    fails(["generate", "--model", tiny_ckpt, "--prompt-file", words_file(tmp_path, 500), "--no-chat"], capsys,
          "leaves no room")
    argv = ["generate", "--model", tiny_ckpt, "--prompt", "the cat sat", "--json", "--max-new-tokens", 6,
            "--temperature", 0.9, "--seed", 11]
    a = json.loads(succeeds(argv, capsys).out)
    fails(["generate", "--model", tiny_ckpt, "--prompt", "   "], capsys, "empty prompt")
    b = json.loads(succeeds(argv, capsys).out)
    assert a == {**b, "stats": a["stats"], "env": a["env"]} and a["token_ids"] == b["token_ids"]
    assert {"device", "torch", "date", "commit"} <= set(a["env"]) and a["dtype"] == "float32"


# ============================================================================ happy paths (default model)
STATS = ("tokens_per_second", "prefill_seconds", "setup_seconds", "decode_seconds", "rounds")


def check_generate_json(out: str, tok, attention: str, max_new: int) -> dict:
    lines = out.strip().splitlines()
    assert len(lines) == 1, out
    res = json.loads(lines[0])
    assert res["attention"] == attention and res["mode"] == "ar"
    ids = res["token_ids"]
    assert isinstance(ids, list) and 1 <= len(ids) <= max_new and all(isinstance(i, int) for i in ids)
    assert all(0 <= i < tok.vocab_size for i in ids)
    if len(ids) < max_new:
        assert ids[-1] in tok.eos_ids
    assert res["text"] == tok.decode([i for i in ids if i not in tok.eos_ids])
    s = res["stats"]
    for k in STATS:
        assert isinstance(s[k], (int, float)) and s[k] >= 0, (k, s)
    assert s["rounds"] == len(ids) - 1 and s["new_tokens"] == len(ids)
    assert s["prefill_seconds"] > 0
    return res


def test_generate_json_default_model_real_load(capsys, default_model):
    # the one happy path that really loads the default model through the CLI
    _, tok = default_model
    out, err = succeeds(["generate", "--attention", "dense", "--prompt", "Name a primary color.", "--json",
                         "--max-new-tokens", 6], capsys)
    res = check_generate_json(out, tok, "dense", 6)
    assert "loaded" not in err  # --json keeps stderr quiet
    ids = tok.encode_chat([{"role": "user", "content": "Name a primary color."}])
    model, _ = default_model
    want = generate_ar(Runner(model, attention="dense", max_len=128), ids, SamplingParams(0.0), 6,
                       stop_ids=tok.eos_ids)
    assert res["token_ids"] == want.token_ids


@pytest.mark.parametrize("attention", ["dense", "nsa"])
def test_generate_json(capsys, fast_default, default_model, attention):
    _, tok = default_model
    prompt = random.Random(fresh_seed()).choice(["Say hello.", "What is 2+2?", "Name a fruit.", "Count to three."])
    out, _ = succeeds(["generate", "--attention", attention, "--prompt", prompt, "--json", "--max-new-tokens", 8],
                      capsys)
    res = check_generate_json(out, tok, attention, 8)
    assert fast_default == ["default"]
    # a short prompt lies inside the default NSA window: NSA and dense generate the same tokens
    other = "nsa" if attention == "dense" else "dense"
    out2, _ = succeeds(["generate", "--attention", other, "--prompt", prompt, "--json", "--max-new-tokens", 8], capsys)
    assert json.loads(out2)["token_ids"] == res["token_ids"]


def test_generate_sampling_is_seeded(capsys, fast_default, default_model):
    model, tok = default_model
    argv = ["generate", "--prompt", "Tell me a story.", "--json", "--max-new-tokens", 10, "--temperature", 0.7,
            "--seed", 3]
    a = json.loads(succeeds(argv, capsys).out)
    b = json.loads(succeeds(argv, capsys).out)
    assert a["token_ids"] == b["token_ids"] and a["text"] == b["text"]
    ids = tok.encode_chat([{"role": "user", "content": "Tell me a story."}])
    from ssv.engine.device_round import DeviceEngine
    r = Runner(model, attention="nsa", max_len=128)
    # the CLI samples on the device round, its coins from the engine's generator seeded with --seed
    want = generate_ar(r, ids, SamplingParams(0.7), 10, seed=3, stop_ids=tok.eos_ids, engine=DeviceEngine(r))
    assert a["token_ids"] == want.token_ids


def test_generate_text_output(capsys, fast_default):
    out, err = succeeds(["generate", "--prompt", "Say hi.", "--max-new-tokens", 4], capsys)
    assert out.endswith("\n") and not out.lstrip().startswith("{")
    assert "tokens" in err and "tok/s decode" in err and "rounds" in err


@pytest.mark.parametrize("attention", ["dense", "nsa"])
def test_ppl_json_default_model(capsys, fast_default, default_model, tmp_path, attention):
    import inspect
    import typing

    model, tok = default_model
    f = tmp_path / "typing_part.py"
    f.write_text(inspect.getsource(typing)[:6000], encoding="utf-8")
    out, _ = succeeds(["ppl", "--attention", attention, "--file", f, "--context", 192, "--json"], capsys)
    lines = out.strip().splitlines()
    assert len(lines) == 1
    res = json.loads(lines[0])
    assert res["tokens"] == 96 and res["context"] == 192 and res["score_from"] == 96
    assert res["attention"] == attention and res["file"] == "typing_part.py"
    assert ("gating" in res) == (attention == "nsa")
    assert 1.0 < res["perplexity"] < 100.0  # real Python source under a real model
    ids = tok.encode(f.read_text(encoding="utf-8"))[:192]
    want = perplexity(Runner(model, attention=attention, max_len=192, scratch=8), ids, 96)
    assert res["perplexity"] == pytest.approx(want["perplexity"], rel=1e-6)


# ============================================================================ entry points
def test_python_dash_m_ssv(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    missing = tmp_path / "absent"
    p = subprocess.run([sys.executable, "-m", "ssv", "generate", "--model", str(missing), "--prompt", "hi"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 2, p
    assert f"ssv: error: checkpoint path does not exist: {missing}" in p.stderr and p.stdout == ""
    p = subprocess.run([sys.executable, "-m", "ssv", "--help"], capture_output=True, text=True, env=env, timeout=60)
    assert p.returncode == 0 and "generate" in p.stdout and "ppl" in p.stdout
    script = shutil.which("ssv", path=str(Path(sys.executable).parent))
    if script:
        p = subprocess.run([script, "ppl", "--help"], capture_output=True, text=True, env=env, timeout=60)
        assert p.returncode == 0 and "--context" in p.stdout


@pytest.mark.parametrize("mode_args", [["--mode", "sd-naive"],
                                       ["--mode", "ssv", "--group-size", "4", "--traversal", "dfs", "--no-fallback"],
                                       ["--mode", "ssv", "--lookup", "6", "--no-fallback"]])
def test_generate_speculative_modes_equal_ar(capsys, fast_default, random_head, mode_args):
    prompt = random.Random(fresh_seed()).choice(["Say hello.", "Name three colors.", "What is rain?"])
    base = ["generate", "--prompt", prompt, "--json", "--max-new-tokens", 10]
    ar = json.loads(succeeds(base, capsys)[0])
    out = json.loads(succeeds(base + mode_args + ["--draft", random_head, "--tree-tokens", 12,
                                                  "--tree-depth", 3, "--tree-topk", 4], capsys)[0])
    assert out["token_ids"] == ar["token_ids"]
    st = out["stats"]
    assert st["rounds"] >= 1 and st["mean_accepted_length"] >= 1.0
    assert len(st["acceptance_by_depth"]) == (6 if "--lookup" in mode_args else 3)


def test_speculative_bad_input(capsys, fast_default, random_head, tmp_path):
    base = ["generate", "--prompt", "hi", "--max-new-tokens", 4, "--mode", "ssv"]
    fails(base + ["--draft", tmp_path / "nope"], capsys, "nope")
    fails(base + ["--draft", random_head, "--group-size", 3], capsys, "group size")
    fails(base + ["--draft", random_head, "--tree-depth", 0], capsys, "depth")
    fails(base + ["--draft", random_head, "--refresh-every", 2], capsys, "approx")


def test_generate_with_a_profile(capsys, fast_default, random_head, tmp_path):
    """--profile: the planner picks each round's strategy (strict ones only): output stays that of ar."""
    from ssv.spec.planner import Entry, Profile, Strategy
    from ssv.spec.tree import TreeSpec

    small = Strategy("small", TreeSpec(2, 2, 4), "dfs", 2)
    wide = Strategy("wide", TreeSpec(3, 4, 12), "pos", 4)
    approx = Strategy("approx", TreeSpec(3, 4, 12), "pos", 16, "approx")
    Profile([20, 4096], [[Entry(wide, 2.0, 0.1), Entry(approx, 9.0, 0.1)], [Entry(small, 1.5, 0.1)]]).save(
        tmp_path / "p.json")
    base = ["generate", "--prompt", "Name three colors.", "--json", "--max-new-tokens", 10]
    ar = json.loads(succeeds(base, capsys)[0])
    out = json.loads(succeeds(base + ["--mode", "ssv", "--draft", random_head, "--profile", tmp_path / "p.json"],
                              capsys)[0])
    assert out["token_ids"] == ar["token_ids"]
    assert [s["to"] for s in out["stats"]["planner"]["switches"]] == ["small"]   # the prompt is > 20 tokens
    fails(base + ["--mode", "sd-naive", "--draft", random_head, "--profile", tmp_path / "p.json"], capsys, "profile")
    fails(base + ["--mode", "ssv", "--draft", random_head, "--profile", tmp_path / "none.json"], capsys, "none.json")


def test_bench_spec_command_writes_results_and_profile(capsys, fast_default, random_head, tmp_path):
    args = ["bench", "spec", "--device", "cpu", "--draft", random_head, "--contexts", 48, "--docs", 1,
            "--new-tokens", 6, "--warmup", 2, "--tree-depth", 3, "--tree-topk", 2, "--tree-tokens", 6,
            "--out", tmp_path, "--modes", "ssv strict", "ssv strict tree 2x2x4", "--extra-trees", "2,2,4"]
    succeeds(args, capsys)
    d = json.loads((tmp_path / "spec-cpu.json").read_text())
    assert {r["mode"] for r in d["rows"]} == {"ar", "ssv strict", "ssv strict tree 2x2x4"}
    assert d["env"]["commit"] and d["env"]["date"]
    assert all(r["first_diff_vs_ar"] is None for r in d["rows"])     # strict, fp32: identical to ar
    prof = json.loads((tmp_path / "profile-cpu.json").read_text())
    trees = {e["strategy"]["name"]: e["strategy"]["tree"]["depth"] for e in prof["entries"][0]}
    assert trees == {"ssv strict": 3, "ssv strict tree 2x2x4": 2}
    fails(args[:-1] + ["2x2x4"], capsys, "depth,top-k,tokens")


def test_shipped_head_speculates_losslessly(capsys, fast_default):
    """The head shipped in ssv/data loads by default, accepts drafts, and keeps greedy output exact."""
    from ssv.draft import default_head_path

    if not (default_head_path() / "model.safetensors").is_file():
        pytest.skip("no shipped head in this checkout")
    base = ["generate", "--prompt", "Explain what a linked list is.", "--json", "--max-new-tokens", 24]
    ar = json.loads(succeeds(base, capsys)[0])
    out = json.loads(succeeds(base + ["--mode", "ssv", "--tree-tokens", 24, "--no-fallback"], capsys)[0])
    assert out["token_ids"] == ar["token_ids"]
    assert out["stats"]["mean_accepted_length"] > 1.3  # a trained head, not a random one


def test_cpu_ssv_defaults_to_the_cpu_profile_tree(capsys, fast_default, random_head):
    """--mode ssv on the CPU drafts the small tree of its measured profile (cli.cpu_tree()); sd-naive and
    explicit tree options keep theirs; output stays that of ar."""
    base = ["generate", "--prompt", "Name a fruit.", "--json", "--max-new-tokens", 6]
    ar = json.loads(succeeds(base, capsys)[0])
    base += ["--draft", random_head]
    depth = {}
    for name, extra in (("ssv", ["--mode", "ssv", "--no-fallback"]), ("sd-naive", ["--mode", "sd-naive"]),
                        ("explicit", ["--mode", "ssv", "--no-fallback", "--tree-depth", 4, "--tree-topk", 2,
                                      "--tree-tokens", 6])):
        out = json.loads(succeeds(base + extra, capsys)[0])
        assert out["token_ids"] == ar["token_ids"]
        depth[name] = len(out["stats"]["acceptance_by_depth"])
        if name == "ssv":   # with the CPU's context lookup, verified only where the chain has tokens
            assert (out["stats"]["lookup"], out["stats"]["spares"]) == (cli.cpu_lookup(), False)
    from ssv.ops.linear.cpu import cpu_forms
    assert ar["cpu_gemm"] == list(cpu_forms())   # the run's GEMM forms, recorded
    assert cli.cpu_tree()[0] not in (4, 6)
    assert depth == {"ssv": max(cli.cpu_tree()[0], cli.cpu_lookup()), "sd-naive": 6, "explicit": 4}


def test_cpu_tree_and_prior_follow_the_blas_form_for_four_rows(monkeypatch):
    import ssv.ops.linear.cpu as cpu_gemm
    from ssv.engine.spec import SpecOptions
    from ssv.spec.fallback import ArFallback
    from ssv.spec.tree import TreeSpec
    cpu = "cpu"
    lookups = set()
    for form, nodes, prior in (("linear", 3, 1.3), ("transposed", 4, 1.6), ("packed", 4, 1.5)):
        monkeypatch.setenv(cpu_gemm.ENV, form)
        assert cli.cpu_tree() == (2, 2, nodes)
        assert cli.fallback_for(cpu, SpecOptions(tree=TreeSpec(2, 2, nodes))).prior_break_even == prior
        f = cli.fallback_for(cpu, SpecOptions(tree=TreeSpec(2, 2, nodes), lookup=3, spares=False))
        # with a lookup: the measured prior where there is one, and rounds alone judge
        assert f.prior_break_even == {"linear": 1.6, "packed": 1.6}.get(form, prior) and not f.use_agreement
        lookups.add(cli.cpu_lookup())
    # the lookup does not follow the form: a 4-row form that flips between processes (within the
    # calibration's margin) must not switch the chain on and off (session 34)
    assert len(lookups) == 1 and lookups.pop() > 0
    # a 4-node tree where the machine's own tree has 3 nodes takes the default prior
    monkeypatch.setenv(cpu_gemm.ENV, "linear")
    assert cli.fallback_for(cpu, SpecOptions(tree=TreeSpec(2, 2, 4))).prior_break_even == ArFallback().prior_break_even


def test_a_calibrated_cpu_takes_the_fourth_node_where_it_costs_little(monkeypatch):
    # without SSV_CPU_GEMM the tree follows the calibration's price of the 4th row, not the 4-row form
    import ssv.ops.linear.cpu as cpu_gemm
    monkeypatch.setenv(cpu_gemm.ENV, "auto")
    costs = {3: 7.5e-3, 4: 8.8e-3}   # session 36's Intel VM: F.linear at 3 rows, packed at 4
    monkeypatch.setattr(cpu_gemm, "row_cost", lambda rows: costs.get(rows))
    monkeypatch.setattr(cpu_gemm, "cpu_form", lambda rows: "packed")
    assert cli.cpu_tree() == (2, 2, 3)
    costs[4] = 7.5e-3 * cli.FOURTH_ROW            # 4 rows priced as 3 (session 24's AMD VM): 4 nodes
    assert cli.cpu_tree() == (2, 2, 4)
    costs[4] *= 1.01
    assert cli.cpu_tree() == (2, 2, 3)


def test_cpu_fallback_prior_and_the_no_round_message(capsys, fast_default, random_head):
    """On the CPU's small tree the fall-back compares the prompt's estimate with the CPU's break-even
    (by its BLAS form), elsewhere with the default prior; a random head's drafts do not pay on a long prompt, so decoding is AR
    from the first step, the output is ar's, and stderr says why no round ran (no MAL of 0)."""
    from ssv.engine.spec import SpecOptions
    from ssv.spec.fallback import ArFallback
    from ssv.spec.tree import TreeSpec
    cpu = "cpu"
    from ssv.ops.linear.cpu import cpu_form
    prior = lambda device, tree: cli.fallback_for(device, SpecOptions(tree=TreeSpec(*tree))).prior_break_even  # noqa: E731
    assert prior(cpu, cli.cpu_tree()) == cli.CPU_BREAK_EVEN[cpu_form(4)]
    assert prior(cpu, cli.DEFAULT_TREE) == ArFallback().prior_break_even
    assert prior("cuda", cli.cpu_tree()) == ArFallback().prior_break_even
    prompt = "List the planets of the solar system in order, with one short fact about each of them, please."
    base = ["generate", "--prompt", prompt, "--chat", "--max-new-tokens", 6]
    ar = succeeds(base + ["--json"], capsys)[0]
    # without the CPU's lookup (the head's agreement then estimates a round)
    out, err = succeeds(base + ["--mode", "ssv", "--draft", random_head, "--lookup", 0], capsys)
    assert out.strip() == json.loads(ar)["text"].strip()
    assert "0 rounds" in err and "drafts would accept" in err and "mean accepted length" not in err


def test_cuda_ssv_defaults_to_the_lookup_in_the_default_trees_rows():
    """--mode ssv on CUDA: the 48 rows as a 40-node head tree and a chain of GPU_LOOKUP from the context
    (spares: fixed rows for the graphs); a given tree or lookup, and sd-naive, keep theirs."""
    from types import SimpleNamespace
    base = dict(device="cuda", mode="ssv", tree_depth=None, tree_topk=None, tree_tokens=None, lookup=None,
                group_size=4, precision="strict", refresh_every=1, traversal="pos")
    o = cli._spec_options(SimpleNamespace(**base), 30)
    d, k, n = cli.DEFAULT_TREE
    assert (o.tree.depth, o.tree.top_k, o.tree.total_tokens, o.lookup, o.spares) == (d, k, n - cli.GPU_LOOKUP,
                                                                                      cli.GPU_LOOKUP, True)
    assert o.tree.total_tokens + o.lookup == n
    for extra, want in (({"lookup": 0}, (n, 0)), ({"lookup": 4}, (n, 4)), ({"tree_tokens": 32}, (32, 0)),
                        ({"mode": "sd-naive"}, (n, 0))):
        o = cli._spec_options(SimpleNamespace(**{**base, **extra}), 30)
        assert (o.tree.total_tokens, o.lookup) == want, extra
