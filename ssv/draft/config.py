"""EAGLE-3 head configuration, serialised as the EAGLE-3 / SpecForge config.json.

    {"architectures": ["LlamaForCausalLMEagle3"], "hidden_size", "intermediate_size",
     "num_attention_heads", "num_key_value_heads", "head_dim", "rms_norm_eps", "rope_theta",
     "rope_scaling", "max_position_embeddings", "vocab_size" (target), "draft_vocab_size",
     "target_hidden_size", "num_hidden_layers": 1,
     "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, L//2 - 1, L - 4]},
     "ssv_draft_window": 512}                       # ours: the draft attention's sliding window

Layer ids name decoder layers whose OUTPUTS are tapped (SGLang adds 1 and captures layer inputs).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

from ssv.config import ModelConfig, RopeConfig

ARCHITECTURE = "LlamaForCausalLMEagle3"
DEFAULT_WINDOW = 512


def default_layer_ids(n_layers: int) -> tuple:
    """EAGLE-3 default taps: the OUTPUTS of decoder layers 1, L//2 - 1 and L - 4 (SGLang captures the
    inputs of layers 2, L//2, L-3, i.e. the same hidden states)."""
    ids = (1, n_layers // 2 - 1, n_layers - 4)
    if n_layers < 5 or len(set(ids)) != 3:
        # tiny targets: three distinct layers spread over the stack
        ids = tuple(sorted({0, max(0, n_layers // 2 - 1), n_layers - 1}))
        if len(ids) != 3:
            raise ValueError(f"an EAGLE-3 head taps three distinct layers: it needs a target of at least 4, got {n_layers}")
    return ids


@dataclass(frozen=True)
class Eagle3Config:
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int                   # target vocabulary
    draft_vocab_size: int
    target_hidden_size: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: Optional[dict] = None
    max_position_embeddings: int = 2048
    aux_layer_ids: Optional[tuple] = None   # None: default_layer_ids(target layers)
    window: int = DEFAULT_WINDOW
    extra: dict = field(default_factory=dict, compare=False)  # unknown config.json keys, kept verbatim

    def __post_init__(self):
        for name in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
                     "head_dim", "vocab_size", "draft_vocab_size", "target_hidden_size",
                     "max_position_embeddings", "window"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ValueError(f"Eagle3Config.{name} must be a positive int, got {v!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                             f"num_key_value_heads ({self.num_key_value_heads})")
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for RoPE, got {self.head_dim}")
        if self.draft_vocab_size > self.vocab_size:
            raise ValueError(f"draft_vocab_size ({self.draft_vocab_size}) exceeds vocab_size ({self.vocab_size})")
        if not self.rms_norm_eps > 0:
            raise ValueError(f"rms_norm_eps must be positive, got {self.rms_norm_eps}")
        if self.aux_layer_ids is not None:
            ids = tuple(int(i) for i in self.aux_layer_ids)
            if len(ids) != 3 or len(set(ids)) != 3 or min(ids) < 0:
                raise ValueError(f"eagle_aux_hidden_state_layer_ids must be 3 distinct layer indices >= 0, "
                                 f"got {list(self.aux_layer_ids)}")
            object.__setattr__(self, "aux_layer_ids", ids)
        self.rope  # validates rope_theta / rope_scaling

    @property
    def rope(self) -> RopeConfig:
        from ssv.loaders.hf import rope_from_hf

        return rope_from_hf({"rope_theta": self.rope_theta, "rope_scaling": self.rope_scaling},
                            "EAGLE-3 config.json")

    def layer_ids(self, n_layers: int) -> tuple:
        """Target layers whose outputs feed `fc`, in the order of fc's input columns."""
        ids = self.aux_layer_ids or default_layer_ids(n_layers)
        if max(ids) >= n_layers:
            raise ValueError(f"EAGLE-3 head taps layers {list(ids)} but the target has only {n_layers} layers")
        return ids

    # ------------------------------------------------------------------ config.json
    def to_json_dict(self, torch_dtype: str = "bfloat16") -> dict:
        d = dict(self.extra)
        d.update({
            "architectures": [ARCHITECTURE],
            "model_type": "llama",
            "hidden_act": "silu",
            "num_hidden_layers": 1,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": self.rope_scaling,
            "max_position_embeddings": self.max_position_embeddings,
            "vocab_size": self.vocab_size,
            "draft_vocab_size": self.draft_vocab_size,
            "target_hidden_size": self.target_hidden_size,
            "tie_word_embeddings": False,
            "torch_dtype": torch_dtype,
            "ssv_draft_window": self.window,
        })
        eagle = dict(d.get("eagle_config") or {})
        if self.aux_layer_ids is not None:
            eagle["eagle_aux_hidden_state_layer_ids"] = list(self.aux_layer_ids)
        eagle.setdefault("use_aux_hidden_state", True)
        d["eagle_config"] = eagle
        return d

    @classmethod
    def from_json_dict(cls, d: dict, where: str = "config.json") -> "Eagle3Config":
        if not isinstance(d, dict):
            raise ValueError(f"{where} must hold a JSON object")
        # architectures is not checked: EAGLE's own training config says "LlamaForCausalLM"
        if int(d.get("num_hidden_layers", 1)) != 1:
            raise ValueError(f"{where}: EAGLE-3 heads have exactly 1 decoder layer, got num_hidden_layers="
                             f"{d['num_hidden_layers']}")
        if d.get("hidden_act", "silu") != "silu":
            raise ValueError(f"{where}: only hidden_act 'silu' is supported, got {d['hidden_act']!r}")
        for key in ("hidden_size", "intermediate_size", "num_attention_heads", "vocab_size"):
            if key not in d:
                raise ValueError(f"{where}: missing required key {key!r}")
        hidden, heads = int(d["hidden_size"]), int(d["num_attention_heads"])
        eagle = d.get("eagle_config") or {}
        ids = eagle.get("eagle_aux_hidden_state_layer_ids", d.get("eagle_aux_hidden_state_layer_ids"))
        rope_theta, rope_scaling = d.get("rope_theta", 10000.0), d.get("rope_scaling")
        params = d.get("rope_parameters")  # transformers 5 layout
        if isinstance(params, dict) and params:
            rope_theta = params.get("rope_theta", rope_theta)
            rope_scaling = None if params.get("rope_type", "default") == "default" else dict(params)
        known = {"architectures", "model_type", "hidden_act", "num_hidden_layers", "hidden_size",
                 "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                 "rms_norm_eps", "rope_theta", "rope_scaling", "rope_parameters", "max_position_embeddings",
                 "vocab_size", "draft_vocab_size", "target_hidden_size", "tie_word_embeddings",
                 "torch_dtype", "ssv_draft_window", "eagle_aux_hidden_state_layer_ids"}
        return cls(
            hidden_size=hidden,
            intermediate_size=int(d["intermediate_size"]),
            num_attention_heads=heads,
            num_key_value_heads=int(d.get("num_key_value_heads") or heads),
            head_dim=int(d.get("head_dim") or hidden // heads),
            vocab_size=int(d["vocab_size"]),
            draft_vocab_size=int(d.get("draft_vocab_size") or d["vocab_size"]),
            target_hidden_size=int(d.get("target_hidden_size") or hidden),
            rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
            rope_theta=float(rope_theta),
            rope_scaling=rope_scaling or None,
            max_position_embeddings=int(d.get("max_position_embeddings", 2048)),
            aux_layer_ids=tuple(ids) if ids else None,
            window=int(d.get("ssv_draft_window", DEFAULT_WINDOW)),
            extra={k: v for k, v in d.items() if k not in known},
        )

    @classmethod
    def for_target(cls, target: ModelConfig, draft_vocab_size: Optional[int] = None,
                   window: int = DEFAULT_WINDOW, layer_ids: Optional[Sequence[int]] = None,
                   max_position_embeddings: int = 2048) -> "Eagle3Config":
        """A head shaped like one decoder layer of `target` (EAGLE-3's choice)."""
        from ssv.loaders.hf import rope_scaling_to_hf
        rope, scaling = target.rope, rope_scaling_to_hf(target.rope)
        return cls(
            hidden_size=target.hidden_size, intermediate_size=target.intermediate_size,
            num_attention_heads=target.n_heads, num_key_value_heads=target.n_kv_heads,
            head_dim=target.head_dim, vocab_size=target.vocab_size,
            draft_vocab_size=draft_vocab_size or target.vocab_size, target_hidden_size=target.hidden_size,
            rms_norm_eps=target.norm_eps, rope_theta=rope.theta, rope_scaling=scaling,
            max_position_embeddings=max_position_embeddings,
            aux_layer_ids=tuple(layer_ids) if layer_ids else default_layer_ids(target.n_layers),
            window=window)


def check_compatible(cfg: Eagle3Config, target: ModelConfig) -> None:
    """Raise ValueError when a head cannot draft for `target`."""
    problems = []
    if cfg.vocab_size != target.vocab_size:
        problems.append(f"vocab_size {cfg.vocab_size} != target vocab {target.vocab_size}")
    if cfg.target_hidden_size != target.hidden_size:
        problems.append(f"target_hidden_size {cfg.target_hidden_size} != target hidden size {target.hidden_size}")
    if cfg.hidden_size != target.hidden_size:
        problems.append(f"hidden_size {cfg.hidden_size} != target hidden size {target.hidden_size} "
                        f"(the head embeds tokens with the target's embedding)")
    try:
        cfg.layer_ids(target.n_layers)
    except ValueError as e:
        problems.append(str(e))
    if problems:
        raise ValueError("EAGLE-3 head does not match this target: " + "; ".join(problems))
