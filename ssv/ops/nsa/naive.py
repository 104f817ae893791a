"""Reference Native Sparse Attention over a committed prefix plus a batch of new tokens.

Ground truth for every NSA kernel in ssv: fp32, clarity first, chunked over queries so an 8K prefill
fits in CPU memory. The math is in README.md beside this file; in short, each query sees a *virtual
sequence* (the committed prefix followed by its own root-to-node path), and the three NSA branches
are defined on that sequence, so a compression block holding draft tokens is specific to the path.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch

from ssv.config import NSAConfig

NEG_INF = float("-inf")
CMP = "chgb,chbd->chgd"   # probabilities over path-specific compressed blocks
TOK = "chgs,hsd->chgd"   # probabilities over cache slots


@dataclass
class NSAOutput:
    o: torch.Tensor             # [N, Hq, D] gated / merged output
    o_cmp: torch.Tensor         # [N, Hq, D] per-branch outputs (each normalised on its own)
    o_slc: torch.Tensor
    o_win: torch.Tensor
    lse_cmp: torch.Tensor       # [N, Hq] natural-log log-sum-exp of each branch (-inf: empty)
    lse_slc: torch.Tensor
    lse_win: torch.Tensor
    block_indices: torch.Tensor  # [N, Hkv, n] selected selection-block indices, ascending, -1 padded
    importance: torch.Tensor     # [N, Hkv, NBs] routing importance (-inf: not a candidate)


def num_cmp_blocks(length: int, cfg: NSAConfig) -> int:
    """Compression blocks complete within the first `length` positions."""
    if length < cfg.cmp_block:
        return 0
    return (length - cfg.cmp_block) // cfg.cmp_stride + 1


def compress_mean(k: torch.Tensor, n_blocks: int, cfg: NSAConfig) -> torch.Tensor:
    """Mean-pooled compressed keys/values of the first n_blocks blocks of k [H, L, D] -> [H, n_blocks, D]."""
    if n_blocks == 0:
        return k.new_zeros(k.shape[0], 0, k.shape[2])
    win = k.unfold(1, cfg.cmp_block, cfg.cmp_stride)[:, :n_blocks]  # [H, n_blocks, D, l]
    return win.float().mean(-1)


def check_visibility(prefix_len: int, positions: torch.Tensor, tree_mask: torch.Tensor) -> None:
    """Every query must see exactly one new token at each position prefix_len..pos (itself included)."""
    positions, tree_mask = positions.cpu(), tree_mask.cpu()  # tiny; integer matmul has no CUDA kernel
    n = positions.numel()
    if tree_mask.shape != (n, n):
        raise ValueError(f"tree_mask must be [{n}, {n}], got {tuple(tree_mask.shape)}")
    if n == 0:
        return
    rel = positions - prefix_len
    if bool((rel < 0).any()) or bool((rel >= n).any()):
        raise ValueError("positions of new tokens must lie in [prefix_len, prefix_len + N)")
    if not bool(tree_mask.diagonal().all()):
        raise ValueError("tree_mask: every query must see itself")
    onehot = torch.nn.functional.one_hot(rel, n).to(torch.int64)      # [N(s), N(pos)]
    seen = tree_mask.to(torch.int64) @ onehot                           # [N(q), N(pos)]
    want = (torch.arange(n)[None, :] <= rel[:, None]).to(torch.int64)
    if not torch.equal(seen, want):
        raise ValueError("tree_mask: each query must see exactly one new token at every position "
                         "from prefix_len to its own (its root-to-node path)")


def select_blocks(importance: torch.Tensor, pos: torch.Tensor, cfg: NSAConfig) -> torch.Tensor:
    """Top-n selection blocks with forced blocks; ties go to the lower block index.

    importance: [Nq, Hkv, NBs], -inf where a block is not a candidate. Returns [Nq, Hkv, n], ascending, -1 padded.
    """
    nq, hkv, nbs = importance.shape
    j = torch.arange(nbs, device=importance.device)
    cur = (pos // cfg.slc_block)[:, None]                                 # [Nq, 1]
    forced = (j[None] > cur - cfg.forced_local) & (j[None] <= cur)
    if cfg.forced_first:
        forced = forced | (j[None] == 0)
    key = torch.where(forced[:, None, :] & (importance > NEG_INF), torch.full_like(importance, math.inf),
                      importance)
    # stable sort on the negated key keeps equal keys in index order: deliberate tie-break
    order = torch.sort(-key, dim=-1, stable=True).indices[..., : cfg.n_select]
    taken = torch.gather(key, -1, order) > NEG_INF
    idx = torch.where(taken, order, torch.full_like(order, nbs))
    idx = torch.sort(idx, dim=-1).values
    idx[idx == nbs] = -1
    if idx.shape[-1] < cfg.n_select:
        idx = torch.cat([idx, idx.new_full((nq, hkv, cfg.n_select - idx.shape[-1]), -1)], -1)
    return idx


def _attend(scores: torch.Tensor, mask: torch.Tensor, v: torch.Tensor, spec: str):
    """Masked softmax attention; `spec` is the einsum of probabilities with v. Returns (o, lse)."""
    s = scores.masked_fill(~mask, NEG_INF)
    lse = torch.logsumexp(s, -1)
    p = torch.exp(s - lse.clamp_min(-1e30)[..., None])  # rows with lse = -inf become exactly 0
    return torch.einsum(spec, p, v), lse


def merge_lse(parts):
    """Combine (o, lse) of attention over disjoint key sets into attention over their union."""
    lse = torch.logsumexp(torch.stack([l for _, l in parts]), 0)
    o = 0
    for o_b, l_b in parts:
        o = o + torch.exp(l_b - lse.clamp_min(-1e30)).nan_to_num(0.0)[..., None] * o_b
    return o, lse


def nsa_naive(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, prefix_len: int, positions: torch.Tensor,
              tree_mask: torch.Tensor, cfg: NSAConfig, gates: Optional[torch.Tensor] = None,
              block_indices: Optional[torch.Tensor] = None, k_cmp: Optional[torch.Tensor] = None,
              v_cmp: Optional[torch.Tensor] = None, scale: Optional[float] = None,
              chunk: int = 128) -> NSAOutput:
    """NSA for N new tokens over a committed prefix.

    q: [N, Hq, D] (RoPE applied); k, v: [Hkv, L, D] cache: committed prefix in slots [0, P), the N new
    tokens in slots [P, P+N); positions [N]; tree_mask [N, N] (q sees new token s); gates [N, Hq, 3]
    (cmp, slc, win) for gating "gated"; block_indices [N, Hkv, n] to reuse a routing instead of
    computing one; k_cmp/v_cmp [Hkv, >=nb, D] compressed blocks of the prefix (computed if None).
    """
    n, hq, d = q.shape
    hkv, L, _ = k.shape
    P = int(prefix_len)
    if hq % hkv:
        raise ValueError(f"query heads ({hq}) must be a multiple of KV heads ({hkv})")
    if P + n > L or v.shape != k.shape or k.shape[2] != d:
        raise ValueError(f"cache shape {tuple(k.shape)} cannot hold prefix {P} + {n} new tokens of dim {d}")
    if cfg.gating == "gated" and (gates is None or gates.shape != (n, hq, 3)):
        raise ValueError("gating 'gated' needs gates of shape [N, Hq, 3]")
    check_visibility(P, positions, tree_mask)
    if n == 0:
        z = q.new_zeros(0, hq)
        return NSAOutput(q.float(), q.float(), q.float(), q.float(), z, z, z,
                         torch.zeros(0, hkv, cfg.n_select, dtype=torch.long), z.new_zeros(0, hkv, 0))
    g = hq // hkv
    scale = d ** -0.5 if scale is None else scale
    l, st, ls = cfg.cmp_block, cfg.cmp_stride, cfg.slc_block
    qf = q.float()
    kf, vf = k[:, : P + n].float(), v[:, : P + n].float()
    dev = q.device
    positions, tree_mask = positions.to(dev), tree_mask.to(dev)
    pos_slot = torch.cat([torch.arange(P, device=dev), positions.long()])             # [P+N] position of each key slot
    max_pos = int(positions.max())

    # compressed blocks: the prefix's are shared, later ones are summed over each query's own path
    nb_all = num_cmp_blocks(max_pos + 1, cfg)
    nb_pre = num_cmp_blocks(P, cfg)
    if k_cmp is None:
        k_cmp, v_cmp = compress_mean(kf, nb_pre, cfg), compress_mean(vf, nb_pre, cfg)
    kc_pre, vc_pre = k_cmp[:, :nb_pre].float(), v_cmp[:, :nb_pre].float()
    # membership of key slots in compression blocks; path blocks only involve slots from s0 on
    start = torch.arange(nb_all, device=dev) * st
    memb = (pos_slot[None] >= start[:, None]) & (pos_slot[None] < start[:, None] + l)  # [NB, P+N]
    s0 = nb_pre * st
    in_blk = memb[nb_pre:, s0:]                                             # [NBp, P+N-s0]

    nbs = max_pos // ls + 1
    j = torch.arange(nbs, device=dev)
    ci = torch.arange(nb_all, device=dev)
    # overlap[i, j]: compression block i shares a token with selection block j
    overlap = ((ci[:, None] * st < (j[None] + 1) * ls) & (ci[:, None] * st + l > j[None] * ls)).float()

    outs = {key: [] for key in ("o", "o_cmp", "o_slc", "o_win", "lse_cmp", "lse_slc", "lse_win", "idx", "imp")}
    for c0 in range(0, n, chunk):
        rows = slice(c0, min(n, c0 + chunk))
        qc = qf[rows].view(-1, hkv, g, d)                                   # [C, Hkv, G, D]
        pos = positions[rows].long()
        vis = torch.cat([torch.ones(qc.shape[0], P, dtype=torch.bool, device=dev), tree_mask[rows]], 1)  # [C, P+N]

        # ---- compressed branch (standard form: it also drives routing)
        w = (vis[:, None, s0:] & in_blk[None]).float() / l                # [C, NBp, P+N-s0]
        kc_path = torch.einsum("cbs,hsd->chbd", w, kf[:, s0:])
        vc_path = torch.einsum("cbs,hsd->chbd", w, vf[:, s0:])
        kc = torch.cat([kc_pre[None].expand(qc.shape[0], -1, -1, -1), kc_path], 2)  # [C, Hkv, NB, D]
        vc = torch.cat([vc_pre[None].expand(qc.shape[0], -1, -1, -1), vc_path], 2)
        cvalid = (ci[None] * st + l - 1) <= pos[:, None]                    # [C, NB]
        s_cmp = torch.einsum("chgd,chbd->chgb", qc, kc) * scale
        o_cmp, lse_cmp = _attend(s_cmp, cvalid[:, None, None, :], vc, CMP)

        # ---- routing: group-summed compressed probabilities spread over overlapping selection blocks
        if block_indices is None:
            p_cmp = torch.exp(s_cmp - lse_cmp.clamp_min(-1e30)[..., None]).masked_fill(~cvalid[:, None, None], 0)
            imp = p_cmp.sum(2) @ overlap                                    # [C, Hkv, NBs]
            cand = (j[None] * ls) <= pos[:, None]
            imp = imp.masked_fill(~cand[:, None, :], NEG_INF)
            idx = select_blocks(imp, pos, cfg)
        else:
            idx = block_indices[rows].long()
            imp = torch.full((qc.shape[0], hkv, nbs), NEG_INF, device=dev)

        # ---- token masks on the virtual sequence
        s_tok = torch.einsum("chgd,hsd->chgs", qc, kf) * scale               # [C, Hkv, G, P+N]
        tok_blk = pos_slot // ls
        sel = torch.zeros(qc.shape[0], hkv, nbs + 1, dtype=torch.bool, device=dev)
        sel.scatter_(2, torch.where(idx < 0, nbs, idx).clamp_max(nbs), True)
        in_sel = sel[:, :, tok_blk] & vis[:, None, :]                      # [C, Hkv, P+N]
        in_win = vis & (pos_slot[None] > pos[:, None] - cfg.window)         # [C, P+N]
        
        if cfg.gating == "gated":
            o_slc, lse_slc = _attend(s_tok, in_sel[:, :, None], vf, TOK)
            o_win, lse_win = _attend(s_tok, in_win[:, None, None], vf, TOK)
            gt = gates[rows].float().view(-1, hkv, g, 3)
            o = gt[..., 0:1] * o_cmp + gt[..., 1:2] * o_slc + gt[..., 2:3] * o_win
        else:
            o_slc, lse_slc = _attend(s_tok, (in_sel & ~in_win[:, None])[:, :, None], vf, TOK)
            o_win, lse_win = _attend(s_tok, in_win[:, None, None], vf, TOK)
            parts = [(o_slc, lse_slc), (o_win, lse_win)]
            if cfg.gating == "union_cmp":
                # compressed keys stand for the stride's worth of tokens nobody else covers
                covered = (in_sel | in_win[:, None]).float()                 # [C, Hkv, P+N]
                blk_cov = torch.einsum("chs,bs->chb", covered, memb.float())
                free = cvalid[:, None] & (blk_cov == 0)                        # [C, Hkv, NB]
                o_cmp, lse_cmp = _attend(s_cmp + math.log(st), free[:, :, None], vc, CMP)
                parts.append((o_cmp, lse_cmp))
            o, _ = merge_lse(parts)

        for key, val in (("o", o), ("o_cmp", o_cmp), ("o_slc", o_slc), ("o_win", o_win), ("lse_cmp", lse_cmp),
                         ("lse_slc", lse_slc), ("lse_win", lse_win)):
            outs[key].append(val.reshape(val.shape[0], hq, *val.shape[3:]))
        outs["idx"].append(idx)
        outs["imp"].append(imp)

    cat = {key: torch.cat(val) for key, val in outs.items()}
    return NSAOutput(cat["o"], cat["o_cmp"], cat["o_slc"], cat["o_win"], cat["lse_cmp"], cat["lse_slc"],
                     cat["lse_win"], cat["idx"], cat["imp"])
