"""The target as a teacher: batched answer generation and batched tapped-features + logits forwards.

backend "hf": a transformers LlamaForCausalLM / Qwen2ForCausalLM built from our state dict (the
internal naming IS Hugging Face's), for batched `generate` and padded full-sequence forwards on the
GPU. Tapped features are caught with forward hooks on the decoder layers (the output of layer i,
before the final norm -- what Transformer.forward(taps=...) returns).
backend "ssv": our own Transformer through a Runner (dense or NSA attention), one sequence at a
time: slow, but exactly the target the engine verifies with (and the only choice for gated NSA).
"""
from __future__ import annotations

from typing import List, Sequence

import torch

from ssv.config import ModelConfig

BACKENDS = ("hf", "ssv")


def hf_config(cfg: ModelConfig, pad_id: int = 0):
    """A transformers config equivalent to `cfg` (Llama, or Qwen2 when it has q/k/v biases)."""
    if cfg.nsa is not None and cfg.nsa.gating == "gated":
        raise ValueError("a gated-NSA checkpoint has no Hugging Face equivalent; use --teacher-backend ssv")
    from ssv.loaders.hf import rope_scaling_to_hf
    rope = {"rope_type": "default", **(rope_scaling_to_hf(cfg.rope) or {}), "rope_theta": cfg.rope.theta}
    kw = dict(vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
              num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads, num_key_value_heads=cfg.n_kv_heads,
              max_position_embeddings=cfg.max_seq_len, rms_norm_eps=cfg.norm_eps, rope_parameters=rope,
              tie_word_embeddings=cfg.tie_embeddings, bos_token_id=cfg.bos_token_id,
              eos_token_id=list(cfg.eos_token_ids) or None, pad_token_id=pad_id)
    if cfg.attn_bias:
        from transformers import Qwen2Config

        return Qwen2Config(**kw)
    from transformers import LlamaConfig

    return LlamaConfig(head_dim=cfg.head_dim, **kw)


def build_hf_model(cfg: ModelConfig, state_dict: dict, device="cpu", dtype=torch.float32, pad_id: int = 0):
    from transformers import LlamaForCausalLM, Qwen2ForCausalLM

    hc = hf_config(cfg, pad_id)
    cls = Qwen2ForCausalLM if cfg.attn_bias else LlamaForCausalLM
    with torch.device("meta"):
        model = cls(hc)
    model = model.to_empty(device="cpu")
    missing, unexpected = model.load_state_dict(state_dict, strict=False)
    missing = [m for m in missing if not (cfg.tie_embeddings and m == "lm_head.weight") and "rotary" not in m]
    if missing or unexpected:
        raise ValueError(f"state dict does not fit the HF model: missing {missing[:5]}, unexpected {unexpected[:5]}")
    if cfg.tie_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    # non-persistent RoPE buffers came from the meta device: rebuild them
    model.model.rotary_emb = type(model.model.rotary_emb)(config=hc)
    return model.to(device=device, dtype=dtype).eval()


class Teacher:
    """feats + logits of right-padded batches, and batched answer generation."""

    def __init__(self, cfg: ModelConfig, state_dict: dict, layer_ids: Sequence[int], device="cpu",
                 dtype=torch.float32, backend: str = "hf", attention: str = "dense", pad_id: int = 0):
        if backend not in BACKENDS:
            raise ValueError(f"teacher backend must be one of {BACKENDS}, got {backend!r}")
        self.cfg, self.layer_ids, self.backend = cfg, tuple(layer_ids), backend
        self.device, self.dtype, self.pad_id = torch.device(device), dtype, pad_id
        if backend == "hf":
            self.model = build_hf_model(cfg, state_dict, self.device, dtype, pad_id)
            self._caught = {}
            for i in set(self.layer_ids):
                self.model.model.layers[i].register_forward_hook(self._hook(i))
        else:
            from ssv.model import Transformer
            from ssv.model.layers import rope_inv_freq

            with torch.device("meta"):
                m = Transformer(cfg)
            m = m.to_empty(device="cpu")
            m.load_hf_state_dict(state_dict)
            m = m.to(device=self.device, dtype=dtype).eval()
            m.inv_freq = rope_inv_freq(cfg.head_dim, cfg.rope).to(self.device)
            self.model, self.attention = m, attention

    @property
    def embed_weight(self) -> torch.Tensor:
        """The target's token embedding [vocab, hidden] (shared with the draft head)."""
        m = self.model.model if self.backend == "hf" else self.model
        return m.embed_tokens.weight

    def _hook(self, i):
        def fn(_module, _inp, out):
            self._caught[i] = out[0] if isinstance(out, tuple) else out
        return fn

    @torch.no_grad()
    def forward(self, ids: torch.Tensor, lengths: torch.Tensor):
        """ids [B, T] right-padded, lengths [B] -> (feats [B, T, 3H] in layer_ids order, logits [B, T, V])."""
        ids = ids.to(self.device)
        if self.backend == "hf":
            mask = (torch.arange(ids.shape[1], device=self.device)[None] < lengths.to(self.device)[:, None]).long()
            self._caught = {}
            logits = self.model(input_ids=ids, attention_mask=mask).logits
            feats = torch.cat([self._caught[i] for i in self.layer_ids], -1)
            self._caught = {}
            return feats, logits
        from ssv.attention import StepMeta
        from ssv.engine.runner import Runner

        B, T = ids.shape
        feats = torch.zeros(B, T, 3 * self.cfg.hidden_size, dtype=self.dtype, device=self.device)
        logits = torch.zeros(B, T, self.cfg.vocab_size, dtype=torch.float32, device=self.device)
        order = sorted(set(self.layer_ids))
        for b in range(B):
            n = int(lengths[b])
            runner = Runner(self.model, attention=self.attention, max_len=max(n, 1), scratch=0)
            lg, taps = runner.forward(ids[b, :n], StepMeta.chain(0, n, self.device), taps=order)
            feats[b, :n] = torch.cat([taps[order.index(i)] for i in self.layer_ids], -1)
            logits[b, :n] = lg
        return feats, logits

    @torch.no_grad()
    def generate(self, prompts: List[List[int]], max_new_tokens: int, eos_ids: Sequence[int],
                 sample: bool = False, temperature: float = 0.8, top_p: float = 0.95, seed: int = 0) -> List[List[int]]:
        """Answers (up to and including the first EOS) of a batch of prompts."""
        if self.backend != "hf":
            return [self._generate_one(p, max_new_tokens, eos_ids, sample, temperature, top_p, seed + i)
                    for i, p in enumerate(prompts)]
        from transformers import GenerationConfig

        T = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), T), self.pad_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for b, p in enumerate(prompts):  # left padding for batched generation
            ids[b, T - len(p):], mask[b, T - len(p):] = torch.tensor(p), 1
        gc = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=sample, temperature=temperature if sample else None,
                              top_p=top_p if sample else None, top_k=None, pad_token_id=self.pad_id,
                              eos_token_id=list(eos_ids) or None, bos_token_id=self.cfg.bos_token_id)
        torch.manual_seed(seed)
        out = self.model.generate(input_ids=ids.to(self.device), attention_mask=mask.to(self.device),
                                  generation_config=gc)[:, T:].cpu().tolist()
        return [_cut(a, eos_ids) for a in out]

    def _generate_one(self, prompt, max_new_tokens, eos_ids, sample, temperature, top_p, seed):
        from ssv.engine.generate import generate_ar
        from ssv.engine.runner import Runner
        from ssv.spec.accept import SamplingParams

        runner = Runner(self.model, attention=self.attention, max_len=len(prompt) + max_new_tokens + 1)
        params = SamplingParams(temperature=temperature if sample else 0.0, top_p=top_p if sample else 1.0)
        res = generate_ar(runner, prompt, params, max_new_tokens, seed=seed, stop_ids=tuple(eos_ids))
        return _cut(res.token_ids[:max_new_tokens], eos_ids)


def _cut(answer: List[int], eos_ids: Sequence[int]) -> List[int]:
    for i, t in enumerate(answer):
        if t in eos_ids:
            return answer[: i + 1]
    return answer
