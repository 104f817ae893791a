"""Hugging Face Llama / Qwen2 checkpoint folders (config.json + safetensors, single or sharded).

The internal naming *is* the Hugging Face Llama naming, so tensors are taken as they are (cast to
fp32); only derived buffers (`rotary_emb.inv_freq`) are dropped and a tied `lm_head.weight` that a
checkpoint stores anyway is dropped when it equals the embedding.
"""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Optional

import torch

from ssv.config import ModelConfig, RopeConfig
from ssv.loaders import (check_state_dict, config_int, detect_folder_kind, read_config_json,
                         read_safetensors_folder)

__all__ = ["load_hf", "config_from_hf"]

_DERIVED = re.compile(r"(^|\.)rotary_emb\.inv_freq$")


def _ids(value) -> tuple:
    if value is None:
        return ()
    if isinstance(value, (list, tuple)):
        return tuple(int(v) for v in value if v is not None)
    return (int(value),)


def rope_scaling_to_hf(rope: RopeConfig) -> Optional[dict]:
    """The Hugging Face `rope_scaling` dict of a RopeConfig (None: plain RoPE); inverse of rope_from_hf."""
    if rope.scaling == "linear":
        return {"rope_type": "linear", "factor": rope.factor}
    if rope.scaling == "llama3":
        return {"rope_type": "llama3", "factor": rope.factor, "low_freq_factor": rope.low_freq_factor,
                "high_freq_factor": rope.high_freq_factor,
                "original_max_position_embeddings": rope.original_max_position}
    return None


def rope_from_hf(cfg: dict, where: str = "config.json") -> RopeConfig:
    """RopeConfig from transformers 5 `rope_parameters` or transformers 4 `rope_theta` + `rope_scaling`."""
    params = cfg.get("rope_parameters")
    if isinstance(params, dict) and params and not all(isinstance(v, dict) for v in params.values()):
        theta = params.get("rope_theta", cfg.get("rope_theta", 10000.0))
        scaling = params
    else:
        if isinstance(params, dict) and params:  # per-layer-type parameters (not used by llama/qwen2)
            raise ValueError(f"{where}: per-layer-type rope_parameters are not supported")
        theta = cfg.get("rope_theta", 10000.0)
        scaling = cfg.get("rope_scaling") or {}
    rope_type = scaling.get("rope_type", scaling.get("type")) if scaling else None
    if rope_type in (None, "default"):
        return RopeConfig(theta=float(theta))
    if rope_type == "linear":
        return RopeConfig(theta=float(theta), scaling="linear", factor=float(scaling["factor"]))
    if rope_type == "llama3":
        return RopeConfig(
            theta=float(theta),
            scaling="llama3",
            factor=float(scaling["factor"]),
            low_freq_factor=float(scaling.get("low_freq_factor", 1.0)),
            high_freq_factor=float(scaling.get("high_freq_factor", 4.0)),
            original_max_position=int(scaling.get("original_max_position_embeddings", 8192)),
        )
    raise ValueError(f"{where}: unsupported rope scaling type {rope_type!r}; supported: none/'default', "
                     f"'linear', 'llama3'")


def config_from_hf(cfg: dict, where: str = "config.json") -> ModelConfig:
    model_type = cfg.get("model_type") or "llama"
    if model_type not in ("llama", "qwen2"):
        raise ValueError(f"unsupported model_type {model_type!r} in {where}; supported: llama, qwen2, nsa")
    act = cfg.get("hidden_act", "silu")
    if act not in ("silu", "swish"):
        raise ValueError(f"{where}: hidden_act {act!r} is not supported (SwiGLU with silu only)")
    if cfg.get("mlp_bias"):
        raise ValueError(f"{where}: mlp_bias=true is not supported")
    if model_type == "qwen2":
        layer_types = cfg.get("layer_types") or []
        if cfg.get("use_sliding_window") or any(t != "full_attention" for t in layer_types):
            raise ValueError(f"{where}: Qwen2 sliding-window layers are not supported")
    try:
        hidden = int(cfg["hidden_size"])
        n_heads = int(cfg["num_attention_heads"])
        n_layers = int(cfg["num_hidden_layers"])
        inter = int(cfg["intermediate_size"])
        vocab = int(cfg["vocab_size"])
    except KeyError as e:
        raise ValueError(f"{where} lacks required key {e.args[0]!r}") from None
    n_kv = config_int(cfg, "num_key_value_heads", n_heads, where)
    head_dim = config_int(cfg, "head_dim", hidden // n_heads if n_heads > 0 else 0, where)
    tie = cfg.get("tie_word_embeddings")
    return ModelConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=inter,
        n_layers=n_layers,
        n_heads=n_heads,
        n_kv_heads=int(n_kv),
        head_dim=int(head_dim),
        max_seq_len=config_int(cfg, "max_position_embeddings", 8192, where),
        norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope=rope_from_hf(cfg, where),
        tie_embeddings=bool(tie) if tie is not None else False,
        attn_bias=model_type == "qwen2" or bool(cfg.get("attention_bias", False)),
        nsa=None,
        bos_token_id=None if cfg.get("bos_token_id") is None else int(cfg["bos_token_id"]),
        eos_token_ids=_ids(cfg.get("eos_token_id")),
    )


def load_hf(folder) -> tuple:
    """(ModelConfig, fp32 state dict, Tokenizer or None) from a Llama / Qwen2 folder."""
    folder = Path(folder)
    if not folder.exists():
        raise FileNotFoundError(f"checkpoint path does not exist: {folder}")
    cfg = read_config_json(folder)
    where = str(folder / "config.json")
    if detect_folder_kind(cfg, where) != "hf":
        raise ValueError(f"{where}: model_type {cfg.get('model_type')!r} is not a Llama/Qwen2 checkpoint")
    config = config_from_hf(cfg, where)

    sd = read_safetensors_folder(folder)
    for k in [k for k in sd if _DERIVED.search(k)]:
        del sd[k]
    if config.tie_embeddings and "lm_head.weight" in sd:
        emb = sd.get("model.embed_tokens.weight")
        if emb is not None and emb.shape == sd["lm_head.weight"].shape and torch.equal(emb, sd["lm_head.weight"]):
            del sd["lm_head.weight"]
        # else: left in place, so check_state_dict reports it as unexpected
    check_state_dict(sd, config, source=str(folder))

    from ssv.tokenizer import Tokenizer

    tok = Tokenizer.from_hf_folder(folder, bos_id=config.bos_token_id, eos_ids=config.eos_token_ids)
    if tok is not None and tok.vocab_size > config.vocab_size:
        # A tokenizer may be smaller than the (padded) embedding, never larger.
        raise ValueError(f"{folder}: tokenizer has {tok.vocab_size} tokens but the model's vocab_size is "
                         f"{config.vocab_size}")
    if tok is not None:  # fill ids the config leaves out from the tokenizer's
        if not config.eos_token_ids and tok.eos_ids:
            config = dataclasses.replace(config, eos_token_ids=tuple(tok.eos_ids))
        if config.bos_token_id is None and tok.bos_id is not None:
            config = dataclasses.replace(config, bos_token_id=tok.bos_id)
    return config, sd, tok
