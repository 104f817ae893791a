"""Checkpoint loading: GGUF files, Hugging Face Llama/Qwen2 folders, flash-linear-attention NSA folders.

Every loader returns a `ModelConfig` and an fp32 state dict in the internal (Hugging Face Llama)
naming, validated against the config: no tensor missing, none extra, every shape as the config
implies.

    load_checkpoint("default")          # SmolLM2-135M-Instruct GGUF (converted once, then cached)
    load_checkpoint("/path/model.gguf")
    load_checkpoint("/path/hf_folder")  # config.json model_type llama | qwen2 | nsa (FLA)
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Optional

import torch

from ssv.config import ModelConfig

__all__ = [
    "LoadedCheckpoint",
    "load_checkpoint",
    "expected_shapes",
    "check_state_dict",
    "SUPPORTED_MODEL_TYPES",
]

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "nsa")


@dataclass
class LoadedCheckpoint:
    config: ModelConfig
    state_dict: dict  # internal name -> fp32 torch.Tensor
    tokenizer: Optional[object]  # ssv.tokenizer.Tokenizer or None
    source: str  # human-readable description of where it came from


# ---------------------------------------------------------------------------- validation
def expected_shapes(config: ModelConfig) -> dict:
    """Internal parameter name -> shape, for every tensor a checkpoint of `config` must have."""
    H, V, I = config.hidden_size, config.vocab_size, config.intermediate_size
    q_dim = config.n_heads * config.head_dim
    kv_dim = config.n_kv_heads * config.head_dim
    shapes = {"model.embed_tokens.weight": (V, H)}
    gated = config.nsa is not None and config.nsa.gating == "gated"
    for i in range(config.n_layers):
        p = f"model.layers.{i}."
        shapes[p + "input_layernorm.weight"] = (H,)
        shapes[p + "self_attn.q_proj.weight"] = (q_dim, H)
        shapes[p + "self_attn.k_proj.weight"] = (kv_dim, H)
        shapes[p + "self_attn.v_proj.weight"] = (kv_dim, H)
        shapes[p + "self_attn.o_proj.weight"] = (H, q_dim)
        if config.attn_bias:
            shapes[p + "self_attn.q_proj.bias"] = (q_dim,)
            shapes[p + "self_attn.k_proj.bias"] = (kv_dim,)
            shapes[p + "self_attn.v_proj.bias"] = (kv_dim,)
        if gated:
            shapes[p + "self_attn.g_proj.weight"] = (config.n_heads * 3, H)
        shapes[p + "post_attention_layernorm.weight"] = (H,)
        shapes[p + "mlp.gate_proj.weight"] = (I, H)
        shapes[p + "mlp.up_proj.weight"] = (I, H)
        shapes[p + "mlp.down_proj.weight"] = (H, I)
    shapes["model.norm.weight"] = (H,)
    if not config.tie_embeddings:
        shapes["lm_head.weight"] = (V, H)
    return shapes


def _names(names, source_names: Optional[Mapping[str, str]]) -> str:
    out = []
    for n in names:
        src = source_names.get(n) if source_names else None
        out.append(f"{src} (-> {n})" if src and src != n else n)
    return ", ".join(out)


def check_state_dict(state_dict: Mapping[str, torch.Tensor], config: ModelConfig, source: str = "checkpoint",
                     source_names: Optional[Mapping[str, str]] = None, *, dtype=torch.float32) -> None:
    """Raise ValueError naming every missing tensor, unexpected tensor, or shape mismatch.

    source_names: internal name -> the checkpoint's own name, used in messages.
    """
    expected = expected_shapes(config)
    missing = [n for n in expected if n not in state_dict]
    if missing:
        raise ValueError(f"{source}: missing {len(missing)} tensor(s) required by the config: "
                         f"{_names(missing, source_names)}")
    extra = sorted(n for n in state_dict if n not in expected)
    if extra:
        raise ValueError(f"{source}: {len(extra)} unexpected tensor(s) not used by the config: "
                         f"{_names(extra, source_names)}")
    for n, shape in expected.items():
        t = state_dict[n]
        if tuple(t.shape) != tuple(shape):
            raise ValueError(f"{source}: tensor {_names([n], source_names)} has shape {tuple(t.shape)} "
                             f"but the config implies {tuple(shape)}")
        if dtype is not None and t.dtype != dtype:
            raise ValueError(f"{source}: tensor {n} has dtype {t.dtype}, expected {dtype}")


def read_config_json(folder: Path) -> dict:
    cfg_path = Path(folder) / "config.json"
    if not cfg_path.is_file():
        raise FileNotFoundError(f"{folder} is a folder without config.json; expected a Hugging Face / "
                                f"flash-linear-attention checkpoint folder (config.json + *.safetensors)")
    try:
        with open(cfg_path, encoding="utf-8") as f:
            cfg = json.load(f)
    except json.JSONDecodeError as e:
        raise ValueError(f"{cfg_path} is not valid JSON: {e}") from e
    if not isinstance(cfg, dict):
        raise ValueError(f"{cfg_path} does not hold a JSON object")
    return cfg


def detect_folder_kind(cfg: dict, where: str = "config.json") -> str:
    """'hf' or 'fla' from config.json's model_type / architectures."""
    model_type = cfg.get("model_type")
    archs = cfg.get("architectures") or []
    if model_type == "nsa" or any("NSAForCausalLM" in str(a) for a in archs):
        return "fla"
    if model_type in ("llama", "qwen2"):
        return "hf"
    if model_type is None:
        if any(str(a) in ("LlamaForCausalLM", "Qwen2ForCausalLM") for a in archs):
            return "hf"
        raise ValueError(f"{where} has no model_type (and architectures {archs!r} are not recognised); "
                         f"supported model_type values: {', '.join(SUPPORTED_MODEL_TYPES)}")
    raise ValueError(f"unsupported model_type {model_type!r} in {where}; "
                     f"supported: {', '.join(SUPPORTED_MODEL_TYPES)}")


def config_int(cfg: Mapping, key: str, default: int, where: str) -> int:
    """A positive integer entry of a checkpoint's config.json, `default` where absent (or null); a 0 or a
    negative is refused, not taken for a missing entry (`cfg.get(key) or default` would)."""
    value = cfg.get(key)
    if value is None:
        return default
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
            or value != int(value) or value < 1):
        raise ValueError(f"{where}: {key} must be a positive integer, got {value!r}")
    return int(value)


def read_safetensors(path) -> dict:
    """All tensors of one safetensors file; a damaged file (truncated by a failed copy, not safetensors at
    all) is refused naming it, not with the reader's bare SafetensorError."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file
    try:
        return load_file(str(path))
    except SafetensorError as e:
        raise ValueError(f"cannot read {path}: not a complete safetensors file ({e})") from None


def read_safetensors_folder(folder: Path) -> dict:
    """All tensors of `model.safetensors` or of the shards named by `model.safetensors.index.json`,
    cast to fp32 (a bf16/fp16 -> fp32 cast is exact)."""
    folder = Path(folder)
    single, index = folder / "model.safetensors", folder / "model.safetensors.index.json"
    if index.is_file():
        with open(index, encoding="utf-8") as f:
            weight_map = json.load(f).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise ValueError(f"{index} has no weight_map")
        files = list(dict.fromkeys(weight_map.values()))
    elif single.is_file():
        weight_map, files = None, [single.name]
    else:
        others = sorted(p.name for p in folder.glob("*.bin")) + sorted(p.name for p in folder.glob("*.pt"))
        hint = f" (found {', '.join(others)}: only safetensors checkpoints are supported)" if others else ""
        raise FileNotFoundError(f"{folder} has neither model.safetensors nor model.safetensors.index.json{hint}")

    state_dict = {}
    for name in files:
        shard = folder / name
        if not shard.is_file():
            raise FileNotFoundError(f"shard {name} listed in {index.name} does not exist in {folder}")
        part = read_safetensors(shard)
        for k, t in part.items():
            if k in state_dict:
                raise ValueError(f"tensor {k} appears in more than one shard of {folder}")
            if weight_map is not None and weight_map.get(k) not in (None, name):
                raise ValueError(f"tensor {k} is in shard {name} but the index says {weight_map[k]}")
            state_dict[k] = t if t.dtype == torch.float32 else t.to(torch.float32)
    if weight_map is not None:
        absent = [k for k in weight_map if k not in state_dict]
        if absent:
            raise ValueError(f"{index.name} lists tensor(s) absent from their shards: {', '.join(absent[:20])}")
    return state_dict


# ---------------------------------------------------------------------------- entry point
def load_checkpoint(spec: str = "default", *, progress: bool = True) -> LoadedCheckpoint:
    """Load a checkpoint: "default" (the bundled SmolLM2-135M-Instruct GGUF), a .gguf file, or a folder."""
    if spec is None or str(spec) == "default":
        from ssv.loaders.gguf import default_gguf_path, load_gguf

        path = default_gguf_path()
        config, sd, tok = load_gguf(path, progress=progress)
        return LoadedCheckpoint(config, sd, tok, f"gguf:{path} (default model)")

    path = Path(spec).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"checkpoint path does not exist: {path}")
    if path.is_file():
        if path.suffix.lower() == ".gguf":
            from ssv.loaders.gguf import load_gguf

            config, sd, tok = load_gguf(path, progress=progress)
            return LoadedCheckpoint(config, sd, tok, f"gguf:{path}")
        raise ValueError(f"{path} is a file but not a .gguf; pass a .gguf file or a checkpoint folder")
    if not path.is_dir():
        raise ValueError(f"{path} is neither a file nor a folder")

    cfg = read_config_json(path)
    kind = detect_folder_kind(cfg, str(path / "config.json"))
    if kind == "fla":
        from ssv.loaders.fla import load_fla

        config, sd, tok = load_fla(path)
        return LoadedCheckpoint(config, sd, tok, f"fla-nsa:{path}")
    from ssv.loaders.hf import load_hf

    config, sd, tok = load_hf(path)
    return LoadedCheckpoint(config, sd, tok, f"hf-{cfg.get('model_type') or 'llama'}:{path}")
