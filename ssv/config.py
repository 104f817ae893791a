"""Configuration dataclasses, validated on construction."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Optional

GATINGS = ("gated", "union", "union_cmp")


@dataclass(frozen=True)
class NSAConfig:
    """Native Sparse Attention hyper-parameters (defaults from the NSA paper).

    cmp_block (l) / cmp_stride (d): compression blocks cover positions [i*d, i*d + l).
    slc_block (l'): selection blocks cover positions [j*l', (j+1)*l').
    n_select (n): selected blocks per query and KV head, forced blocks included.
    forced_first / forced_local: block 0 and the `forced_local` blocks ending at the query are
    always selected.
    window (w): the sliding window covers positions (pos - w, pos].
    gating: how the three branches are combined (see ssv/ops/nsa/README.md):
      "gated"     o = g_c o_cmp + g_s o_slc + g_w o_win with the checkpoint's sigmoid gates;
      "union"     one softmax over the tokens of selected blocks and window (training-free);
      "union_cmp" "union" plus compressed keys standing for the uncovered rest (training-free).
    """

    cmp_block: int = 32
    cmp_stride: int = 16
    slc_block: int = 64
    n_select: int = 16
    forced_first: bool = True
    forced_local: int = 2
    window: int = 512
    gating: str = "union"

    def __post_init__(self):
        for name in ("cmp_block", "cmp_stride", "slc_block", "n_select"):
            if getattr(self, name) <= 0:
                raise ValueError(f"NSAConfig.{name} must be positive, got {getattr(self, name)}")
        if self.window < 0:
            raise ValueError(f"NSAConfig.window must be >= 0, got {self.window}")
        if self.cmp_stride > self.cmp_block:
            raise ValueError("NSAConfig.cmp_stride must not exceed cmp_block (blocks would leave gaps)")
        if self.slc_block % self.cmp_stride != 0:
            raise ValueError("NSAConfig.slc_block must be a multiple of cmp_stride")
        if self.forced_local < 0:
            raise ValueError("NSAConfig.forced_local must be >= 0")
        if int(self.forced_first) + self.forced_local > self.n_select:
            raise ValueError("NSAConfig: forced blocks exceed n_select")
        if self.gating not in GATINGS:
            raise ValueError(f"NSAConfig.gating must be one of {GATINGS}, got {self.gating!r}")


@dataclass(frozen=True)
class RopeConfig:
    theta: float = 10000.0
    scaling: Optional[str] = None  # None | "linear" | "llama3"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position: int = 8192

    def __post_init__(self):
        if self.scaling not in (None, "linear", "llama3"):
            raise ValueError(f"unsupported rope scaling {self.scaling!r} (None, 'linear', 'llama3')")
        if self.theta <= 0 or self.factor <= 0:
            raise ValueError("rope theta and factor must be positive")


@dataclass(frozen=True)
class ModelConfig:
    """A Llama-family decoder. Parameter names follow Hugging Face's Llama layout."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    max_seq_len: int = 8192
    norm_eps: float = 1e-5
    rope: RopeConfig = field(default_factory=RopeConfig)
    tie_embeddings: bool = False
    attn_bias: bool = False  # Qwen2 has q/k/v biases
    nsa: Optional[NSAConfig] = None  # set when the checkpoint was trained with NSA
    bos_token_id: Optional[int] = None
    eos_token_ids: tuple = ()

    def __post_init__(self):
        for name in ("vocab_size", "hidden_size", "intermediate_size", "n_layers", "n_heads",
                     "n_kv_heads", "head_dim", "max_seq_len"):
            if getattr(self, name) <= 0:
                raise ValueError(f"ModelConfig.{name} must be positive, got {getattr(self, name)}")
        if self.n_heads % self.n_kv_heads != 0:
            raise ValueError(f"n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.n_kv_heads})")
        if self.head_dim % 2 != 0:
            raise ValueError("head_dim must be even for RoPE")

    @property
    def group_size(self) -> int:
        return self.n_heads // self.n_kv_heads

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "ModelConfig":
        d = dict(d)
        d["rope"] = RopeConfig(**d.get("rope") or {})
        d["nsa"] = NSAConfig(**d["nsa"]) if d.get("nsa") else None
        d["eos_token_ids"] = tuple(d.get("eos_token_ids") or ())
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})
