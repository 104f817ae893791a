"""Llama-family building blocks: RMSNorm, RoPE, SwiGLU MLP, and attention that defers to a plan."""
from __future__ import annotations

import math
from typing import Optional

import torch
from torch import nn
from torch.nn import functional as F

from ssv.config import ModelConfig, RopeConfig
from ssv.ops.linear.cpu import cpu_form, cpu_linear, tensor_version, uses_forms


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


def rope_inv_freq(head_dim: int, rope: RopeConfig) -> torch.Tensor:
    inv = 1.0 / (rope.theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if rope.scaling == "linear":
        inv = inv / rope.factor
    elif rope.scaling == "llama3":
        # Llama 3.1: long wavelengths are slowed by `factor`, short ones kept, a smooth ramp between
        low_wl = rope.original_max_position / rope.low_freq_factor
        high_wl = rope.original_max_position / rope.high_freq_factor
        wl = 2 * math.pi / inv
        smooth = (rope.original_max_position / wl - rope.low_freq_factor) / (
            rope.high_freq_factor - rope.low_freq_factor)
        scaled = torch.where(wl > low_wl, inv / rope.factor, inv)
        mid = (wl <= low_wl) & (wl >= high_wl)
        inv = torch.where(mid, (1 - smooth) * inv / rope.factor + smooth * inv, scaled)
    return inv


def rope_cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor):
    freqs = positions.float()[:, None] * inv_freq[None, :].to(positions.device)
    emb = torch.cat([freqs, freqs], -1)
    return emb.cos(), emb.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [N, H, D] with rotate_half (GPT-NeoX) pairing."""
    x1, x2 = x.chunk(2, -1)
    rot = torch.cat([-x2, x1], -1)
    return (x.float() * cos[:, None] + rot.float() * sin[:, None]).to(x.dtype)


def _cat_cached(owner: nn.Module, name: str, parts, norm_w=None) -> torch.Tensor:
    """torch.cat(parts) kept on `owner` (not a parameter) until any part is replaced or modified;
    norm_w: with that RMSNorm weight folded into its columns (`fold_norm`)."""
    key = tuple((p.data_ptr(), tensor_version(p)) for p in list(parts) + ([] if norm_w is None else [norm_w]))
    hit = owner.__dict__.get(name)
    if hit is None or hit[0] != key:
        from ssv.ops.glue.naive import fold_norm
        w = torch.cat([p.detach() for p in parts])
        hit = owner.__dict__[name] = (key, w if norm_w is None else fold_norm(w, norm_w.detach()))
    return hit[1]


def tuned_linear(x: torch.Tensor, w: torch.Tensor, glu: bool = False, norm: bool = False, acc: bool = False,
                 rope: bool = False):
    """The tiles of the small-M Triton kernel (ssv/ops/linear) for the fused step's GEMM x @ w.T on
    x's device where its table lists them, else None: cuBLAS (rope: the q|k|v projection with its
    RoPE and cache writes in the same launch)."""
    from ssv.ops.linear.policy import tuned_launch
    from ssv.ops.utils import device_name
    n = w.shape[0] // 2 if glu else w.shape[0]
    return tuned_launch(device_name(x.device), x.shape[0], n, w.shape[1], glu, norm, acc, rope=rope)


def linear(x, w, **kw):
    from ssv.ops.linear.ops import linear as _linear   # lazily: Triton reads its mode at import
    return _linear(x, w, **kw)


def add_linear(x: torch.Tensor, a: torch.Tensor, w: torch.Tensor, tap: Optional[torch.Tensor] = None) -> torch.Tensor:
    """x += a @ w.T in place (a residual), rounded once; tap: a place that receives a copy of the result
    (by the GEMM's own launch where ssv/ops/linear's table takes it)."""
    lp = tuned_linear(a, w, acc=True)
    if lp is not None:
        return linear(a, w, out=x, accumulate=True, launch=lp, out2=tap)
    x.addmm_(a, w.t())
    if tap is not None:
        tap.copy_(x)
    return x


def add_mlp(x: torch.Tensor, mlp: "MLP", norm: "RMSNorm", tap: Optional[torch.Tensor] = None) -> torch.Tensor:
    """x += mlp(norm(x)) in place, as the fused step runs it: the norm folded into gate|up, whose
    GEMM ends in SwiGLU where ssv/ops/linear's table takes it (else cuBLAS and a SwiGLU launch that
    applies the norm's row scale), and down_proj adding into x (and its copy into tap, `add_linear`)."""
    from ssv.ops.glue.ops import swiglu
    w_gu = _cat_cached(mlp, "_wgu_n", [mlp.gate_proj.weight, mlp.up_proj.weight], norm.weight)
    lp = tuned_linear(x, w_gu, glu=True, norm=True)
    if lp is not None:   # SwiGLU (and the norm's row scale) inside the GEMM's launch
        h = linear(x, w_gu, norm_eps=norm.eps, glu=True, launch=lp)
    else:
        h = swiglu(F.linear(x, w_gu), norm=(x, norm.eps))
    return add_linear(x, h, mlp.down_proj.weight, tap)


def dense(x: torch.Tensor, w: torch.Tensor, b=None) -> torch.Tensor:
    """x @ w.T (+ b) for the eager layers: F.linear, except for a CPU step's fp32 rows outside autograd,
    which take the form ssv/ops/linear/cpu.py measured fastest on this machine for that many rows."""
    if uses_forms(x.device, x.dtype) and not torch.is_grad_enabled():
        form = cpu_form(x.numel() // max(1, x.shape[-1]))
        if form != "linear":
            return cpu_linear(x, w, b, form)
    return F.linear(x, w, b)


def cpu_step(x: torch.Tensor) -> bool:
    """A CPU fp32 step outside autograd: the eager layers multiply by q|k|v and gate|up concatenated
    (`cpu_weights`), two GEMMs a layer instead of five, each in ssv/ops/linear/cpu.py's form for its
    rows (fewer ops; a CPU step is half op overhead at 2K, bench/NOTES.md, session 26)."""
    return uses_forms(x.device, x.dtype) and not torch.is_grad_enabled()


def fused_glue(x: torch.Tensor) -> bool:
    """The CUDA step runs the fused glue kernels (ssv/ops/glue); elsewhere the eager layers run, and
    so does anything that records gradients (the kernels have no backward: training keeps autograd)."""
    return x.is_cuda and x.dim() == 2 and not torch.is_grad_enabled()


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def cpu_weights(self) -> list:
        """The CPU step's weights: gate|up concatenated (cached), down."""
        return [_cat_cached(self, "_wgu", [self.gate_proj.weight, self.up_proj.weight]), self.down_proj.weight]

    def forward(self, x):
        if cpu_step(x):
            wgu, wd = self.cpu_weights()
            gu, i = dense(x, wgu), wd.shape[1]
            return dense(F.silu(gu[..., :i]) * gu[..., i:], wd)
        return dense(F.silu(dense(x, self.gate_proj.weight)) * dense(x, self.up_proj.weight), self.down_proj.weight)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.cfg, self.layer = cfg, layer
        h, hk, d = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, h * d, bias=cfg.attn_bias)
        self.k_proj = nn.Linear(cfg.hidden_size, hk * d, bias=cfg.attn_bias)
        self.v_proj = nn.Linear(cfg.hidden_size, hk * d, bias=cfg.attn_bias)
        self.o_proj = nn.Linear(h * d, cfg.hidden_size, bias=False)
        gated = cfg.nsa is not None and cfg.nsa.gating == "gated"
        self.g_proj = nn.Linear(cfg.hidden_size, h * 3, bias=False) if gated else None

    def attend_fused(self, x, cos, sin, plan, cache, norm: "RMSNorm | None" = None, pos=None):
        """One projection, one RoPE + cache-write launch, then the plan: o [N, Hq * D] before o_proj.
        norm: x is the un-normalized input of this RMSNorm, folded into the projection (no bias);
        pos: cos / sin are tables by position, pos [N] the rows' positions."""
        from ssv.ops.glue.ops import rope_write
        n, c = x.shape[0], self.cfg
        parts = [self.q_proj.weight, self.k_proj.weight, self.v_proj.weight]
        if norm is not None and c.attn_bias:
            raise ValueError("an RMSNorm folds into a projection without bias only")
        w = _cat_cached(self, "_wqkv" if norm is None else "_wqkv_n", parts, None if norm is None else norm.weight)
        b = _cat_cached(self, "_bqkv", [self.q_proj.bias, self.k_proj.bias, self.v_proj.bias]) if c.attn_bias else None
        slots = plan.slots(cache, n)
        lr = tuned_linear(x, w, norm=norm is not None, rope=True) if b is None else None
        if lr is not None:   # the norm's row scale, RoPE and the cache writes inside the GEMM's launch
            from ssv.ops.linear.ops import linear_rope
            q = linear_rope(x, w, cos, sin, c.n_heads, c.n_kv_heads, cache.k[self.layer], cache.v[self.layer], slots,
                            norm_eps=None if norm is None else norm.eps, pos=pos, launch=lr)
            return plan.run(self.layer, q, cache, None).reshape(n, -1).to(x.dtype)
        lp = tuned_linear(x, w, norm=norm is not None) if b is None else None
        if lp is not None:   # the norm's row scale inside the GEMM's launch
            qkv, norm = linear(x, w, norm_eps=None if norm is None else norm.eps, launch=lp), None
        else:
            qkv = F.linear(x, w, b)
        q = rope_write(qkv, cos, sin, c.n_heads, c.n_kv_heads, cache.k[self.layer],
                       cache.v[self.layer], slots, norm=None if norm is None else (x, norm.eps), pos=pos)
        return plan.run(self.layer, q, cache, None).reshape(n, -1).to(x.dtype)

    def cpu_weights(self) -> list:
        """The CPU step's weights: q|k|v concatenated (cached), o, and a gated layer's g apart."""
        return [_cat_cached(self, "_wqkv", [self.q_proj.weight, self.k_proj.weight, self.v_proj.weight]),
                self.o_proj.weight] + ([self.g_proj.weight] if self.g_proj is not None else [])

    def forward(self, x, cos, sin, plan, cache):
        n = x.shape[0]
        c = self.cfg
        h, hk, d = c.n_heads, c.n_kv_heads, c.head_dim
        if cpu_step(x):
            b = _cat_cached(self, "_bqkv", [self.q_proj.bias, self.k_proj.bias, self.v_proj.bias]) if c.attn_bias else None
            qkv = dense(x, self.cpu_weights()[0], b)
            qk = apply_rope(qkv[:, : (h + hk) * d].view(n, h + hk, d), cos, sin)    # q and k heads at once
            q, k, v = qk[:, :h], qk[:, h:], qkv[:, (h + hk) * d:].view(n, hk, d)
        else:
            q = apply_rope(dense(x, self.q_proj.weight, self.q_proj.bias).view(n, h, d), cos, sin)
            k = apply_rope(dense(x, self.k_proj.weight, self.k_proj.bias).view(n, hk, d), cos, sin)
            v = dense(x, self.v_proj.weight, self.v_proj.bias).view(n, hk, d)
        cache.write_slots(self.layer, k, v, plan.slots(cache, n))
        gates = torch.sigmoid(dense(x, self.g_proj.weight).float()).view(n, c.n_heads, 3) if self.g_proj is not None else None
        o = plan.run(self.layer, q, cache, gates)
        return dense(o.reshape(n, -1).to(x.dtype), self.o_proj.weight)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.norm_eps)
        self.self_attn = Attention(cfg, layer)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x, cos, sin, plan, cache, pos=None, tap: Optional[torch.Tensor] = None):
        """pos: cos / sin are tables by position and pos [N] the rows' positions (read by the fused
        RoPE kernel; gathered here for the eager layer). tap [N, H]: receives a copy of the output."""
        if fused_glue(x) and self.self_attn.g_proj is None:
            return self._forward_fused(x, cos, sin, plan, cache, pos, tap)
        if pos is not None:
            cos, sin = cos[pos], sin[pos]
        x = self._forward_eager(x, cos, sin, plan, cache)
        if tap is not None:
            tap.copy_(x)
        return x

    def _forward_eager(self, x, cos, sin, plan, cache):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, plan, cache)
        return x + self.mlp(self.post_attention_layernorm(x))

    def _forward_fused(self, x, cos, sin, plan, cache, pos=None, tap=None):
        # 5-6 launches besides attention's: four GEMMs (two add the residual in place; the gate|up
        # one ends in SwiGLU where ssv/ops/linear's table takes it, else cuBLAS and a SwiGLU
        # launch), one RoPE + cache write. The norms are folded: RMSNorm(x) @ W.T is
        # rsqrt(mean(x^2) + eps) * (x @ (W * g).T), the weight g in the cached projection and the
        # row scale applied by the GEMM kernel, or the RoPE / SwiGLU kernels after cuBLAS (two
        # launches a layer fewer; a projection
        # with a bias keeps its norm launch). In place: an out-of-place addmm copies the residual
        # into its output first, a kernel per GEMM; the caller keeps no reference to x it still
        # needs (Transformer clones its taps)
        from ssv.ops.glue.ops import rmsnorm
        a, m, n1, n2 = self.self_attn, self.mlp, self.input_layernorm, self.post_attention_layernorm
        if a.cfg.attn_bias:
            o = a.attend_fused(rmsnorm(x, n1.weight, n1.eps), cos, sin, plan, cache, pos=pos)
        else:
            o = a.attend_fused(x, cos, sin, plan, cache, norm=n1, pos=pos)
        add_linear(x, o, a.o_proj.weight)
        return add_mlp(x, m, n2, tap)
