"""flash-linear-attention (FLA) `NSAForCausalLM` checkpoints -> internal Llama naming + NSAConfig.

Layout (fla-org/flash-linear-attention; fla/models/nsa/configuration_nsa.py, modeling_nsa.py,
fla/layers/nsa.py, fla/modules/mlp.py, fla/modules/layernorm.py):

    config.json  model_type "nsa", architectures ["NSAForCausalLM"]; keys hidden_size,
                 num_hidden_layers, num_heads, num_kv_heads, head_dim, qkv_bias, block_size,
                 block_counts, window_size, rope_theta, max_position_embeddings, hidden_ratio,
                 intermediate_size, hidden_act ("swish"), norm_eps, bos/eos_token_id,
                 tie_word_embeddings, vocab_size, elementwise_affine, fuse_* (kernel switches)

    model.embeddings.weight                         -> model.embed_tokens.weight
    model.layers.{i}.attn_norm.weight               -> model.layers.{i}.input_layernorm.weight
    model.layers.{i}.attn.{q,k,v,o,g}_proj.weight   -> model.layers.{i}.self_attn.{q,k,v,o,g}_proj.weight
    model.layers.{i}.attn.{q,k,v}_proj.bias         -> model.layers.{i}.self_attn.{q,k,v}_proj.bias (qkv_bias)
    model.layers.{i}.mlp_norm.weight                -> model.layers.{i}.post_attention_layernorm.weight
    model.layers.{i}.mlp.{gate,up,down}_proj.weight -> model.layers.{i}.mlp.{gate,up,down}_proj.weight
    model.norm.weight                               -> model.norm.weight
    lm_head.weight                                  -> lm_head.weight (absent when tied)
    model.layers.{i}.attn.rotary.inv_freq           (non-persistent in current FLA; dropped if present)

Semantics of FLA's `parallel_nsa` that shape the NSAConfig built here:
  * one block size for everything: compression blocks are non-overlapping mean-pools of the
    (RoPE'd) keys/values, stride = length = block_size; selection blocks are the same blocks.
  * forced blocks: block 0 and the query's own block and the one before it (score 1.0 each), the
    rest ranked by the compressed-attention probabilities summed over the GQA group
    -> forced_first=True, forced_local=2.
  * int `block_counts` is rounded up to a power of two by the kernel (`S =
    triton.next_power_of_2(block_counts)`, and the forward kernel then attends to all S slots), so
    the number of blocks a trained model really attends to is next_pow2(block_counts); n_select is
    set to that (identical for the usual power-of-two values).
  * sliding window: flash-attn `window_size=(window_size-1, 0)`, i.e. keys (t - w, t]; the branch
    is skipped when window_size is 0/None (-> window=0).
  * gates: g_proj output index h*3 + b, b in (cmp, slc, swa), sigmoid -> gating="gated".
Not expressible in NSAConfig (the model must implement these as FLA does):
  * compressed keys/values are plain means of the RoPE'd keys/values of a block (no learned MLP,
    no intra-block position encoding); a query sees only *complete* compressed blocks
    ((c+1)*block_size - 1 <= t) and gets o_cmp = 0 when none is complete;
  * selection scores are exp(q.k_cmp*scale - lse_cmp) summed over the group's query heads, where
    lse_cmp is the compressed branch's log-sum-exp over the complete blocks; candidates other than
    the forced ones are only blocks strictly before the query's own block; ties are broken by
    Triton's bitonic sorting network (no index order);
  * FLA ignores config.head_dim: NSABlock never passes it and NativeSparseAttention defaults to
    head_dim=64. The head_dim used here is the one the tensors have (config value or 64).
"""
from __future__ import annotations

import re
from pathlib import Path

import torch

from ssv.config import ModelConfig, NSAConfig, RopeConfig
from ssv.loaders import (check_state_dict, config_int, detect_folder_kind, read_config_json,
                         read_safetensors_folder)
from ssv.loaders.hf import _ids

__all__ = ["load_fla", "config_from_fla", "fla_to_internal_name", "FLA_LAYER_DEFAULT_HEAD_DIM"]

# fla/layers/nsa.py: NativeSparseAttention(..., head_dim: int = 64, ...); NSABlock does not pass head_dim.
FLA_LAYER_DEFAULT_HEAD_DIM = 64

_LAYER_MAP = {
    "attn_norm.weight": "input_layernorm.weight",
    "mlp_norm.weight": "post_attention_layernorm.weight",
    "attn.q_proj.weight": "self_attn.q_proj.weight",
    "attn.k_proj.weight": "self_attn.k_proj.weight",
    "attn.v_proj.weight": "self_attn.v_proj.weight",
    "attn.o_proj.weight": "self_attn.o_proj.weight",
    "attn.g_proj.weight": "self_attn.g_proj.weight",
    "attn.q_proj.bias": "self_attn.q_proj.bias",
    "attn.k_proj.bias": "self_attn.k_proj.bias",
    "attn.v_proj.bias": "self_attn.v_proj.bias",
    "mlp.gate_proj.weight": "mlp.gate_proj.weight",
    "mlp.up_proj.weight": "mlp.up_proj.weight",
    "mlp.down_proj.weight": "mlp.down_proj.weight",
}
_TOP_MAP = {
    "model.embeddings.weight": "model.embed_tokens.weight",
    "model.norm.weight": "model.norm.weight",
    "lm_head.weight": "lm_head.weight",
}
_LAYER_RE = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
_DERIVED_RE = re.compile(r"^model\.layers\.\d+\.attn\.rotary\.inv_freq$")


def fla_to_internal_name(name: str):
    """Internal name for an FLA tensor name, or None when the name is not part of the FLA layout."""
    if name in _TOP_MAP:
        return _TOP_MAP[name]
    m = _LAYER_RE.match(name)
    if m and m.group(2) in _LAYER_MAP:
        return f"model.layers.{m.group(1)}.{_LAYER_MAP[m.group(2)]}"
    return None


def _next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


def _fla_intermediate_size(cfg: dict, hidden: int) -> int:
    # fla/modules/mlp.py GatedMLP.__init__
    inter = cfg.get("intermediate_size")
    if inter is not None:
        return int(inter)
    ratio = cfg.get("hidden_ratio") or 4
    inter = int(hidden * ratio * 2 / 3)
    return 256 * ((inter + 256 - 1) // 256)


def nsa_config_from_fla(cfg: dict, where: str = "config.json") -> NSAConfig:
    block_size = cfg.get("block_size", 64)
    block_counts = cfg.get("block_counts", 16)
    if not isinstance(block_size, int) or block_size <= 0:
        raise ValueError(f"{where}: block_size must be a positive int, got {block_size!r}")
    if not isinstance(block_counts, int) or block_counts <= 0:
        raise ValueError(f"{where}: block_counts must be a positive int, got {block_counts!r} "
                         f"(per-token block-count tensors are not supported)")
    window = cfg.get("window_size", 512)
    window = 0 if window is None else int(window)
    # The kernel (fla/ops/nsa/parallel.py: parallel_nsa_topk) uses S = next_power_of_2(block_counts)
    # slots and the forward kernel attends to all S of them.
    n_select = _next_pow2(block_counts)
    # FLA forces block 0, the query's own block (IC) and IC - 1 ("the 1st and the last 2 blocks are
    # always selected"). When n_select < 3 FLA keeps only the n_select best of them (all scored 1.0,
    # order decided by the sort network) - not expressible; we keep block 0 plus the local ones.
    forced_local = min(2, n_select - 1)
    return NSAConfig(
        cmp_block=block_size,
        cmp_stride=block_size,
        slc_block=block_size,
        n_select=n_select,
        forced_first=True,
        forced_local=forced_local,
        window=window,
        gating="gated",
    )


def config_from_fla(cfg: dict, where: str = "config.json", head_dim: int = None) -> ModelConfig:
    """ModelConfig for an FLA NSA config.json. head_dim: the one the tensors imply (see module doc)."""
    act = cfg.get("hidden_act", "swish")
    if act not in ("swish", "silu"):
        raise ValueError(f"{where}: hidden_act {act!r} is not supported (FLA GatedMLP only supports swish)")
    try:
        hidden = int(cfg["hidden_size"])
        n_layers = int(cfg["num_hidden_layers"])
        n_heads = int(cfg["num_heads"])
        vocab = int(cfg["vocab_size"])
    except KeyError as e:
        raise ValueError(f"{where} lacks required key {e.args[0]!r}") from None
    n_kv = cfg.get("num_kv_heads")
    n_kv = n_heads if n_kv is None else int(n_kv)
    if head_dim is None:
        head_dim = FLA_LAYER_DEFAULT_HEAD_DIM
    theta = cfg.get("rope_theta")
    return ModelConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=_fla_intermediate_size(cfg, hidden),
        n_layers=n_layers,
        n_heads=n_heads,
        n_kv_heads=n_kv,
        head_dim=int(head_dim),
        max_seq_len=config_int(cfg, "max_position_embeddings", 2048, where),
        norm_eps=float(cfg.get("norm_eps", 1e-6)),
        rope=RopeConfig(theta=float(theta if theta is not None else 10000.0)),
        tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        attn_bias=bool(cfg.get("qkv_bias", False)),
        nsa=nsa_config_from_fla(cfg, where),
        bos_token_id=None if cfg.get("bos_token_id", 1) is None else int(cfg.get("bos_token_id", 1)),
        eos_token_ids=_ids(cfg.get("eos_token_id", 2)),
    )


def _pick_head_dim(cfg: dict, raw: dict) -> int:
    """The head_dim the tensors were built with: config.head_dim, else FLA's layer default 64."""
    n_heads = int(cfg["num_heads"])
    cfg_hd = cfg.get("head_dim")
    q = raw.get("model.layers.0.attn.q_proj.weight")
    if q is None:
        return int(cfg_hd) if cfg_hd else FLA_LAYER_DEFAULT_HEAD_DIM
    for hd in (cfg_hd, FLA_LAYER_DEFAULT_HEAD_DIM):
        if hd and q.shape[0] == n_heads * int(hd):
            return int(hd)
    return int(cfg_hd) if cfg_hd else FLA_LAYER_DEFAULT_HEAD_DIM  # the shape check will report it


def load_fla(folder) -> tuple:
    """(ModelConfig, fp32 state dict in internal names, Tokenizer or None) from an FLA NSA folder."""
    folder = Path(folder)
    if not folder.exists():
        raise FileNotFoundError(f"checkpoint path does not exist: {folder}")
    cfg = read_config_json(folder)
    where = str(folder / "config.json")
    if detect_folder_kind(cfg, where) != "fla":
        raise ValueError(f"{where}: model_type {cfg.get('model_type')!r} is not an FLA NSA checkpoint")
    if "num_heads" not in cfg:
        raise ValueError(f"{where} lacks required key 'num_heads'")

    raw = read_safetensors_folder(folder)
    config = config_from_fla(cfg, where, head_dim=_pick_head_dim(cfg, raw))

    sd, source_names, unknown = {}, {}, []
    for name, t in raw.items():
        if _DERIVED_RE.match(name):
            continue
        internal = fla_to_internal_name(name)
        if internal is None:
            unknown.append(name)
            continue
        sd[internal] = t
        source_names[internal] = name
    if unknown:
        raise ValueError(f"{folder}: {len(unknown)} unexpected tensor(s) not in FLA's NSAForCausalLM layout: "
                         f"{', '.join(sorted(unknown))}")
    if cfg.get("elementwise_affine") is False:
        # FLA RMSNorm without weights == weight of ones.
        ones = torch.ones(config.hidden_size, dtype=torch.float32)
        for i in range(config.n_layers):
            for n in ("input_layernorm", "post_attention_layernorm"):
                sd.setdefault(f"model.layers.{i}.{n}.weight", ones.clone())
        sd.setdefault("model.norm.weight", ones.clone())
    if config.tie_embeddings and "lm_head.weight" in sd:
        if torch.equal(sd["lm_head.weight"], sd.get("model.embed_tokens.weight", torch.empty(0))):
            del sd["lm_head.weight"]
    check_state_dict(sd, config, source=str(folder), source_names=_with_expected_sources(config, source_names))

    from ssv.tokenizer import Tokenizer

    tok = Tokenizer.from_hf_folder(folder, bos_id=config.bos_token_id, eos_ids=config.eos_token_ids)
    return config, sd, tok


def _with_expected_sources(config: ModelConfig, source_names: dict) -> dict:
    """Internal -> FLA name for every expected tensor (so a missing one is named as FLA names it)."""
    from ssv.loaders import expected_shapes

    inverse = {}
    for name in list(_TOP_MAP):
        inverse[_TOP_MAP[name]] = name
    for i in range(config.n_layers):
        for fla_suffix, internal_suffix in _LAYER_MAP.items():
            inverse[f"model.layers.{i}.{internal_suffix}"] = f"model.layers.{i}.{fla_suffix}"
    out = {n: inverse.get(n, n) for n in expected_shapes(config)}
    out.update(source_names)
    return out
