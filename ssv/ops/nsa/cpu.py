"""NSA for a few new tokens on the CPU: `nsa_naive`'s math in a fixed, small number of batched torch ops.

The reference rebuilds every step-constant mask (block membership over all cache slots, windows,
candidates) in every layer and runs two full-length softmaxes per branch pair: on the 2-core CPU at
2K that was ~50 of an AR step's ~80 ms, nearly all of it op overhead, not arithmetic. Here
`CpuStep` computes what depends only on the step (positions, tree mask, prefix length) once, and
`nsa_cpu` runs per layer: compressed scores as one batched matmul (prefix blocks from the cache's
incrementally kept k_cmp, path blocks from the step's weights, pooled once for a chain), routing,
then one masked attention over all visible slots, torch's fused scaled_dot_product_attention (the
"union" gating's selected blocks and window are disjoint parts of one softmax, so merging two
log-sum-exps is the same as attending once over their union). At long contexts it reads only the
blocks some query of a block of rows selects or reaches by its window, copied per KV head
(`_visible_slots`); at short ones it scores every slot and masks.
Gatings "union" and "gated"; "union_cmp" stays on the reference (`supported`).
"""
from __future__ import annotations

import math
from typing import Optional

import torch
from torch.nn import functional as F

from ssv.config import NSAConfig
from ssv.ops.nsa.naive import compress_mean, num_cmp_blocks

NEG_INF = float("-inf")


def supported(cfg: NSAConfig, device) -> bool:
    return cfg.gating in ("union", "gated") and torch.device(device).type == "cpu"


class CpuStep:
    """The step-constant tensors of N new tokens over a committed prefix (see `nsa_naive`'s arguments)."""

    def __init__(self, prefix_len: int, positions: torch.Tensor, tree_mask: torch.Tensor, cfg: NSAConfig):
        P, n, dev = int(prefix_len), positions.numel(), positions.device
        self.P, self.n, self.cfg = P, n, cfg
        l, st, ls = cfg.cmp_block, cfg.cmp_stride, cfg.slc_block
        pos = positions.long()
        self.L = P + n
        pos_slot = torch.cat([torch.arange(P, device=dev), pos])                        # [L]
        vis = torch.cat([torch.ones(n, P, dtype=torch.bool, device=dev), tree_mask.bool()], 1)   # [N, L]
        max_pos = int(pos.max())
        self.nb_pre = nb_pre = num_cmp_blocks(P, cfg)
        nb_all = num_cmp_blocks(max_pos + 1, cfg)
        self.nbs = nbs = max_pos // ls + 1
        # path-specific compression blocks: each query's mean over the slots its own path puts there
        self.s0 = s0 = nb_pre * st
        self.n_path = nb_all - nb_pre
        if self.n_path:
            start = torch.arange(nb_pre, nb_all, device=dev)[:, None] * st
            ps = pos_slot[None, s0:]
            memb = (ps >= start) & (ps < start + l)                                        # [NBp, L - s0]
            seen = vis[:, None, s0:] & memb[None]                                          # [N, NBp, L - s0]
        ci = torch.arange(nb_all, device=dev)
        self.cvalid = (ci[None] * st + l - 1) <= pos[:, None]                             # [N, NB]
        # When every query that may use a path block (its complete ones) sees all of that block (a
        # chain: prefill chunks, AR steps), the blocks are the same for all queries: pooled once and
        # scored with the prefix's (per-query pooling was 11% of a 2K prefill; session 26)
        self.w = self.w_shared = None
        if self.n_path:
            if bool(((seen == memb[None]) | ~self.cvalid[:, nb_pre:, None]).all()):
                self.w_shared = memb.float() / l                                            # [NBp, L - s0]
            else:
                self.w = seen.float() / l                                                   # [N, NBp, L - s0]
        self.all_cmp = bool(self.cvalid.all())
        j = torch.arange(nbs, device=dev)
        # overlap[i, j]: compression block i shares a token with selection block j
        self.overlap = ((ci[:, None] * st < (j[None] + 1) * ls) & (ci[:, None] * st + l > j[None] * ls)).float()
        self.not_cand = ((j[None] * ls) > pos[:, None])[:, None]                          # [N, 1, NBs]
        cur = (pos // ls)[:, None]
        forced = (j[None] > cur - cfg.forced_local) & (j[None] <= cur)
        if cfg.forced_first:
            forced = forced | (j[None] == 0)
        self.forced = forced[:, None]                                                     # [N, 1, NBs]
        self.vis = vis
        self.win = vis & (pos_slot[None] > pos[:, None] - cfg.window)                     # [N, L]
        self.new_blk = pos // ls                                                          # [N] the step's slots' blocks
        # No more candidate blocks than n_select: routing takes every candidate (a candidate's importance
        # is finite), so "union"'s selected blocks with the window are every visible slot. Such a step
        # (contexts up to n_select * slc_block, 1K by default) attends densely, without routing.
        self.all_selected = nbs <= cfg.n_select
        if self.all_selected:
            b = torch.arange(cfg.n_select, device=dev)
            self.all_idx = torch.where(b[None] <= self.new_blk[:, None], b[None], -1)    # [N, n] its selection
        self.pos = pos
        self.nbp = -(-P // ls)                                                            # blocks holding prefix slots
        # the gathered keys and values [2, Hkv, blocks * ls * D], made at the step's first gather and
        # reused by every layer: a fresh ~1 MB tensor a layer was mmap'd and page-faulted each time
        # (an unrecorded profile at 8K: the copies took about 3x as long; bench/NOTES.md, session 25)
        self.gather_buf: Optional[torch.Tensor] = None


def select_blocks_cpu(imp: torch.Tensor, step: CpuStep) -> torch.Tensor:
    """`select_blocks` with the step's forced blocks: [N, Hkv, NBs] -> [N, Hkv, n] ascending, -1 padded."""
    cfg, nbs = step.cfg, step.nbs
    key = imp.masked_fill(step.forced & (imp > NEG_INF), math.inf)
    # stable sort on the negated key keeps equal keys in index order: the reference's tie-break
    order = torch.sort(-key, dim=-1, stable=True).indices[..., : cfg.n_select]
    idx = torch.sort(order.masked_fill(torch.gather(key, -1, order) == NEG_INF, nbs), dim=-1).values
    idx.masked_fill_(idx == nbs, -1)
    if idx.shape[-1] < cfg.n_select:
        idx = torch.cat([idx, idx.new_full((*idx.shape[:2], cfg.n_select - idx.shape[-1]), -1)], -1)
    return idx


def nsa_cpu(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, step: CpuStep, k_cmp: Optional[torch.Tensor] = None,
            v_cmp: Optional[torch.Tensor] = None, gates: Optional[torch.Tensor] = None,
            block_indices: Optional[torch.Tensor] = None, scale: Optional[float] = None,
            out: Optional[torch.Tensor] = None):
    """q [N, Hq, D]; k, v [Hkv, >= L, D] (the step's tokens in slots [P, P + N)); k_cmp / v_cmp [Hkv, >= nb, D]
    the prefix's compressed blocks (pooled here if None); gates [N, Hq, 3] for "gated"; block_indices
    [N, Hkv, n] to reuse a routing. Returns (o [N, Hq, D] fp32, written into `out` if given; block indices)."""
    cfg, n, L = step.cfg, step.n, step.L
    hq, d = q.shape[1], q.shape[2]
    hkv = k.shape[0]
    g = hq // hkv
    gated = cfg.gating == "gated"
    scale = d ** -0.5 if scale is None else scale
    kf, vf = k[:, :L].float(), v[:, :L].float()
    qh = q.float().view(n, hkv, g, d).transpose(0, 1).reshape(hkv, n * g, d)          # [Hkv, N*G, D]
    if block_indices is None and not gated and step.all_selected:
        (o,) = _token_branches(qh.view(hkv, n, g, d), kf, vf, scale, (step.vis[:, None],))
        return _out(o, out, n, hq, d), step.all_idx[:, None].expand(n, hkv, -1)

    need_cmp = block_indices is None or gated
    if need_cmp:
        if k_cmp is None:
            k_cmp, v_cmp = compress_mean(kf, step.nb_pre, cfg), compress_mean(vf, step.nb_pre, cfg)
        kc_pre, vc_pre = k_cmp[:, : step.nb_pre].float(), v_cmp[:, : step.nb_pre].float()
        if step.w_shared is not None:
            kc_pre = torch.cat([kc_pre, torch.matmul(step.w_shared, kf[:, step.s0:])], 1)   # [Hkv, NB, D]
            if gated:
                vc_pre = torch.cat([vc_pre, torch.matmul(step.w_shared, vf[:, step.s0:])], 1)
        s_cmp = torch.bmm(qh, kc_pre.transpose(1, 2)).view(hkv, n, g, -1)                 # [Hkv, N, G, NB]
        if step.w is not None:
            kc_path = torch.einsum("nbs,hsd->hnbd", step.w, kf[:, step.s0:])               # [Hkv, N, NBp, D]
            s_cmp = torch.cat([s_cmp, torch.einsum("hngd,hnbd->hngb", qh.view(hkv, n, g, d), kc_path)], -1)
        s_cmp = (s_cmp * scale).masked_fill_(~step.cvalid[None, :, None], NEG_INF)
        # a query with no complete block yet attends to nothing here: its row is all zero, not NaN
        p_cmp = torch.softmax(s_cmp, -1)
        if not step.all_cmp:
            p_cmp.nan_to_num_(0.0)

    if block_indices is None:
        imp = torch.matmul(p_cmp.sum(2), step.overlap).transpose(0, 1)                    # [N, Hkv, NBs]
        imp = imp.masked_fill(step.not_cand, NEG_INF)
        idx = select_blocks_cpu(imp, step)
    else:
        idx = block_indices.long()

    sel = torch.zeros(n, hkv, step.nbs + 1, dtype=torch.bool, device=q.device)
    sel.scatter_(2, idx.masked_fill(idx < 0, step.nbs), True)
    # the token branches in blocks of rows: each block's scores near SCORE_BLOCK, and in a long chunk
    # each block reads only the blocks its own rows select or reach (`_visible_slots`)
    q4, outs = qh.view(hkv, n, g, d), []
    rows = max(1, SCORE_BLOCK // (hkv * g * L))
    for n0 in range(0, n, rows):
        r = slice(n0, min(n, n0 + rows))
        kt, vt, in_sel, win = _visible_slots(sel[r], step, k, v, kf, vf, r)
        outs.append(_token_branches(q4[:, r], kt, vt, scale, (in_sel, win) if gated else (in_sel | win,)))
    parts = [o[0] if len(o) == 1 else torch.cat(o, 1) for o in zip(*outs)]               # [Hkv, N, G, D] each
    if gated:
        o_slc, o_win = parts
        # a reused (group) routing may miss a query's own block: no selected slot, zero output as in the reference
        o_slc.nan_to_num_(0.0)
        if step.w is not None:   # per-query path blocks
            vc = torch.cat([vc_pre[:, None].expand(-1, n, -1, -1),
                            torch.einsum("nbs,hsd->hnbd", step.w, vf[:, step.s0:])], 2)
            o_cmp = torch.einsum("hngb,hnbd->hngd", p_cmp, vc)
        else:
            o_cmp = torch.bmm(p_cmp.reshape(hkv, n * g, -1), vc_pre).view(hkv, n, g, d)
        gt = gates.float().view(n, hkv, g, 3).permute(3, 1, 0, 2)[..., None]              # [3, Hkv, N, G, 1]
        o = gt[0] * o_cmp + gt[1] * o_slc + gt[2] * o_win
    else:
        (o,) = parts
    return _out(o, out, n, hq, d), idx


def _out(o: torch.Tensor, out: Optional[torch.Tensor], n: int, hq: int, d: int) -> torch.Tensor:
    """o [Hkv, N, G, D] as [N, Hq, D], written into `out` if given."""
    o = o.permute(1, 0, 2, 3).reshape(n, hq, d)
    if out is None:
        return o.contiguous()
    out.copy_(o)
    return out


# Gather the blocks a step reads when that skips at least this many slots; below it, copying them costs
# about what scoring every slot does. The default model's steps read 16-21 blocks of 64 at one row and
# 18-36 at four. Gathered, the 2K AR step (16 of 33 blocks) ran slower, the 4K one (16-20 of 65) 14%
# slower and 4-6-row passes even, the 8K ones (13-29% of 126 blocks) 1.35-1.51x faster
# (bench/results/cpu-packed/attention-steps-*.json; bench/NOTES.md, session 25). A long prefill chunk
# applies it per block of rows; scaled by the block's rows (a block of 30 rows gathering at 2K) it made
# 2K decode passes of 6 rows 1.2x slower and prefill no faster (session 26).
GATHER_SKIPS = 4096


def _visible_slots(sel: torch.Tensor, step: CpuStep, k: torch.Tensor, v: torch.Tensor, kf: torch.Tensor,
                   vf: torch.Tensor, rows: slice = slice(None)) -> tuple:
    """The keys and values the token branches of the step's rows `rows` score, and per row which of
    them its selection and its window keep: (k, v [Hkv, S, D] fp32, in_sel, win [R, Hkv or 1, S]).
    sel [R, Hkv, NBs + 1]: those rows' selected blocks. k, v: the cache's layer (whole blocks are
    copied from it); kf, vf: its first L slots in fp32. When the blocks some row of a head selects,
    with those its window reaches and those holding the step's own slots, are few (long contexts: 16
    selected blocks and a 512-token window of an 8K prefix's 128), only they are copied, per KV head,
    whole blocks at a time; otherwise every slot is scored and masked."""
    P, L, ls, n, hkv = step.P, step.L, step.cfg.slc_block, step.n, k.shape[0]
    own = sel[:, :, step.new_blk] & step.vis[rows, None, P:]                             # [R, Hkv, N]
    first_own, blocks_l = P // ls, -(-L // ls)
    pos, R = step.pos[rows], sel.shape[0]
    gather = L >= GATHER_SKIPS and blocks_l * ls <= k.shape[1]   # (shorter: no gather can skip enough)
    if gather:
        m = min(step.nbs, blocks_l)         # sel's last column is where -1 entries went: not a block
        need = torch.zeros(hkv, blocks_l, dtype=torch.bool, device=k.device)            # [Hkv, NB]
        need[:, :m] = sel[:, :, :m].any(0)
        win_blk = max(0, int(pos.min()) - step.cfg.window + 1) // ls                     # the first a window reaches
        need[:, min(win_blk, first_own):] = True
        count = need.sum(1)
        nb = int(count.max())
        gather = L - nb * ls >= GATHER_SKIPS
    if not gather:
        # the prefix's slots lie in their blocks in order and every query sees them: the block mask
        # widened by repeat (a gather over every slot cost a 4K prefill chunk ~5 ms a layer)
        pre = sel[:, :, : step.nbp].repeat_interleave(ls, dim=2)[:, :, :P]
        return kf, vf, torch.cat([pre, own], 2), step.win[rows, None]
    dev, d = k.device, k.shape[2]
    # each head's needed blocks first, in ascending order (a stable sort of "not needed"), then padding
    blocks = torch.sort((~need).to(torch.uint8), dim=1, stable=True).indices[:, :nb]      # [Hkv, nb]
    # a head that needs fewer pads with its last block (always needed: it holds the step's last slot),
    # masked: no block outside the needed ones is read
    real_b = torch.arange(nb, device=k.device) < count[:, None]                          # [Hkv, nb]
    blocks = torch.where(real_b, blocks, blocks_l - 1)
    buf = step.gather_buf
    if buf is None or buf.shape[1:] != (hkv, blocks_l * ls * d) or buf.dtype != k.dtype:
        buf = step.gather_buf = torch.empty(2, hkv, blocks_l * ls * d, dtype=k.dtype, device=dev)
    kt, vt = (_gather_blocks(x, blocks, blocks_l, ls, b) for x, b in zip((k, v), buf))   # [Hkv, S, D]
    slots = (blocks[:, :, None] * ls + torch.arange(ls, device=dev)).view(hkv, nb * ls)  # [Hkv, S] cache slots
    real = real_b.repeat_interleave(ls, 1) & (slots < L)
    pre = slots < P
    mine = (slots - P).clamp_(0, n - 1)                                                  # an own slot's index
    # (a block past the positions' holds own slots only: its column is never taken)
    by_blk = torch.gather(sel, 2, blocks.clamp(max=step.nbs)[None].expand(R, -1, -1)).repeat_interleave(ls, 2)
    by_own = torch.gather(own, 2, mine[None].expand(R, -1, -1))
    in_sel = torch.where(pre, by_blk, by_own) & real                                     # [R, Hkv, S]
    win_own = step.win[rows, P:][:, mine]                                                # [R, Hkv, S]
    win = torch.where(pre, slots[None] > (pos - step.cfg.window)[:, None, None], win_own) & real
    if L % ls:
        # the last block's slots past the step's (in its copies: a head's last count, then its padding):
        # masked, but a masked score is q.k - inf (NaN for a NaN key) and its weight 0 multiplies v
        # (0 x NaN is NaN): zeroed, a slice a head (a masked_fill over all slots cost 7 ms an 8K step)
        for h, c in enumerate(count.tolist()):
            for x in (kt, vt):
                x[h].view(nb, ls, -1)[c - 1:, L % ls:].zero_()
    return kt, vt, in_sel, win


def _gather_blocks(x: torch.Tensor, blocks: torch.Tensor, blocks_l: int, ls: int,
                   buf: torch.Tensor) -> torch.Tensor:
    """x [Hkv, >= blocks_l * ls, D]'s blocks `blocks` [Hkv, nb] per head -> [Hkv, nb * ls, D] fp32 (in
    `buf` [Hkv, >= nb * ls * D]), by an index_select of whole blocks per head (advanced indexing over
    both dims was slower in an unrecorded microbenchmark)."""
    hkv, d = x.shape[0], x.shape[2]
    nb = blocks.shape[1]
    xb = x[:, : blocks_l * ls].view(hkv, blocks_l, ls * d)
    out = buf[:, : nb * ls * d].view(hkv, nb, ls * d)
    for h in range(hkv):
        torch.index_select(xb[h], 0, blocks[h], out=out[h])
    return out.view(hkv, -1, d).float()


# The token branches' scores [Hkv, N, G, L] are a prefill chunk's largest tensor: once they outgrow
# the caches every pass over them (the product, the mask, the softmax, the product) runs at memory
# speed (a 256-token chunk at 4K: 38 MB, its q.k product 6x the time of one at 2K), so long chunks
# attend in blocks of rows that keep them near this many scores. A decode or verify step is one block.
SCORE_BLOCK = 1 << 21


def _token_branches(q4: torch.Tensor, kt: torch.Tensor, vt: torch.Tensor, scale: float, keeps: tuple) -> list:
    """q4 [Hkv, R, G, D] (R rows); per mask in `keeps` ([R, Hkv or 1, S] bool: the slots of kt, vt [Hkv, S, D]
    each row attends to), the softmax of the token scores over the kept slots times v: [Hkv, R, G, D]
    each (a row with no kept slot gets 0 or NaN, which the gated branch zeroes). One fused
    scaled_dot_product_attention per mask (torch's CPU flash kernel; the scores are never stored):
    1.9x the bmm / mask / softmax / bmm sequence on a prefill block of 30 rows over 2.2K slots in an
    unrecorded microbenchmark, even with it in decode steps (bench/NOTES.md, session 26)."""
    hkv, r, g, d = q4.shape
    S = kt.shape[1]
    outs = []
    if r >= GROUP_HEADS_ROWS:
        # the GQA group as the call's heads: k, v expanded over them and the mask broadcast, not copied G times
        qg, k4, v4 = q4.transpose(1, 2), kt[:, None].expand(hkv, g, S, d), vt[:, None].expand(hkv, g, S, d)
        for keep in keeps:
            m = keep.transpose(0, 1)[:, None]                                             # [Hkv, 1, R, S]
            outs.append(F.scaled_dot_product_attention(qg, k4, v4, attn_mask=m, scale=scale).transpose(1, 2))
        return outs
    qs, k4, v4 = q4.reshape(hkv, 1, r * g, d), kt[:, None], vt[:, None]
    for keep in keeps:
        m = keep.transpose(0, 1)[:, :, None].expand(hkv, r, g, S).reshape(hkv, 1, r * g, S)
        outs.append(F.scaled_dot_product_attention(qs, k4, v4, attn_mask=m, scale=scale).view(hkv, r, g, d))
    return outs


# Rows from which a block of rows attends with the GQA group as the call's heads. There: 1.50 against
# 1.69 ms (30 rows x 2.2K slots), 5.7 against 7.1 (113 x 2.3K); at 4 rows 0.31 against 0.27 ms
# (microbenchmark, unrecorded). A 2K prefill 4.02 against 4.37 s, 8K 34.3 against 36.0 (medians of two
# alternating runs, bench/results/cpu-s26/prefill-ab-group-heads.json).
GROUP_HEADS_ROWS = 8
