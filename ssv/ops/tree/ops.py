"""Launchers of a draft-tree level and of the grown tree's finish (one launch each where the tensor forms are ~15 and ~75)."""
from __future__ import annotations

import torch
import triton

from ssv.ops.pdl import pdl_args
from ssv.ops.tree.kernels import tree_finish_fwd_kernel, tree_level_fwd_kernel

MAX_CANDIDATES = 256   # R * K in one program's registers (a [BN, BN] comparison)


def tree_level(vals, toks, t: int, base: int, root, front, rows_in, tok, par, score, front_out, ftok_out,
               fpar_out, rows_out, num_warps: int = 4) -> None:
    """`tree_level_naive` in one launch, graph-safe (every index is read on the device).

    Pool tok / par / score [M] (int64, int64, float64); vals [R, K] float64 and toks [R, K] int64; root [1] int64 (level 1) ; front [R] int64, rows_in [K, D] int64 (level >= 2);
    outputs front_out, ftok_out, fpar_out [K] int64 and rows_out [K, D] int64 (not rows_in)."""
    R, K = vals.shape
    D = rows_out.shape[1]
    if toks.shape != (R, K):
        raise ValueError(f"tree_level: vals and toks [R, K], got {tuple(vals.shape)} and {tuple(toks.shape)}")
    vals, toks = vals.contiguous(), toks.contiguous()   # no copy from the top-k kernel
    if R * K > MAX_CANDIDATES or (t == 1) != (R == 1) or base + R * K > tok.numel():
        raise ValueError(f"tree_level: level {t} with {R} x {K} candidates at {base} of a {tok.numel()}-node pool")
    if rows_out.shape != (K, D) or rows_out.stride(0) != D or (t > 1 and rows_in.data_ptr() == rows_out.data_ptr()):
        raise ValueError("tree_level: rows_out [K, D] contiguous and apart from rows_in")
    if vals.dtype != torch.float64 or score.dtype != torch.float64:
        raise ValueError("tree_level: vals and score are float64")
    tree_level_fwd_kernel[(1,)](
        vals, toks, root if t == 1 else toks, front if t > 1 else toks, rows_in if t > 1 else rows_out,
        tok, par, score, front_out, ftok_out, fpar_out, rows_out, int(t), int(base), vals.stride(0),
        R=R, K=K, D=D, BN=max(16, triton.next_power_of_2(R * K)), BD=max(16, triton.next_power_of_2(D)),
        FIRST=t == 1, **pdl_args(vals.device), num_warps=num_warps)


MAX_POOL = 1024       # pool nodes of the kept-set rank ([BM, BJ] tiles over the pool)
MAX_TREE = 64         # kept nodes in one program's registers (a few [BT, BT] squares)


def tree_finish(tok, par, score, dlen, T: int, K: int, D: int, order: str, num_warps: int = 32, bj: int = 32,
                spares: int = 0):
    """`tree_finish_naive` in one launch, graph-safe (the length is read on the device).

    Returns tokens, parents, scores (float32), depth, pos [T] and the ancestor mask [T, T] bool, in
    the traversal order `order` ("bfs", "dfs" or "pos"). num_warps, bj: the launch (the pool's rank
    in [BM, bj] tiles). H100, the default tree (`bench/results/gpu-s48/d/`): 27.0-27.8 us at 32 warps,
    44.7-45.1 at 16, 51.0-51.1 at 8 (before session 48's stage 2, on the H200, `bench/results/round-ops/`:
    41 us at 32 warps, 114-126 at 4, against 146 us for the tensor ops it replaces). spares: also the next
    `spares` pool nodes by rank (`ssv.spec.lookup.grow_spares`'s, for a context lookup to displace):
    tokens, parents (a flattened position, or T + i for spare i), scores (float32), depth [spares],
    returned after the six."""
    M = tok.numel()
    if order not in ("bfs", "dfs", "pos"):
        raise ValueError(f"tree_finish: order must be bfs, dfs or pos, got {order!r}")
    if M != 1 + K + (D - 1) * K * K or not 1 <= T <= min(M, MAX_TREE) or M > MAX_POOL:
        raise ValueError(f"tree_finish: {T} kept of a {M}-node pool (top-k {K}, depth {D}); at most {MAX_TREE} "
                         f"of {MAX_POOL}")
    if not 0 <= spares <= 16 or T + spares > M:
        raise ValueError(f"tree_finish: {spares} spares after {T} kept of a {M}-node pool (at most 16)")
    if score.dtype != torch.float64 or par.shape != (M,) or score.shape != (M,):
        raise ValueError("tree_finish: tok / par / score [M], score float64")
    dev = tok.device
    S = max(spares, 1)
    ws = torch.empty(M + 4 * T + S, dtype=torch.long, device=dev)   # stage 1 -> 2, stage 2's gathers, spares
    out = torch.empty(4, T, dtype=torch.long, device=dev)   # tokens, parents, depth, pos
    scores = torch.empty(T, dtype=torch.float32, device=dev)
    mask = torch.empty(T, T, dtype=torch.bool, device=dev)
    sp = torch.empty(3, S, dtype=torch.long, device=dev)   # spares' tokens, parents, depth
    sp_score = torch.empty(S, dtype=torch.float32, device=dev)
    tree_finish_fwd_kernel[(1,)](
        tok, par, score, dlen, ws, ws[M:M + T], ws[M + T:M + 2 * T], ws[M + 2 * T:M + 3 * T], ws[M + 3 * T:M + 4 * T],
        out[0], out[1], scores, out[2], out[3], mask,
        ws[M + 4 * T:], sp[0], sp[1], sp_score, sp[2],
        M=M, T=T, K=K, D=D, BITS=K.bit_length(), LEVEL=order != "dfs", BM=max(16, triton.next_power_of_2(M)),
        BJ=bj, BT=max(16, triton.next_power_of_2(T)), SP=spares, BSP=max(16, triton.next_power_of_2(S)),
        **pdl_args(dev), num_warps=num_warps)
    main = (out[0], out[1], scores, out[2], out[3], mask)
    return main + (sp[0], sp[1], sp_score, sp[2]) if spares else main
