"""NSA routing for a batch of verification queries: compressed attention, importance, top-n.

The launcher (kernels in route_kernels.py and route_split_kernels.py, launch policy in route_policy.py).
Flash-decoding style, so that the keys spread over the whole GPU (a one-launch form for short
caches was measured slower and deleted: route_policy.py):
    1. `nsa_route_score_fwd_kernel` (query group, KV head, split): partial softmax states, the
       compressed blocks' splits and then one a path-specific block (scored from the cache's slots);
       one-sweep form (rows up to ONE_SWEEP_MAX_BLOCKS selection blocks): also each head's sums per
       selection block against its tile's max, then
    2. `nsa_route_merge_topk_fwd_kernel` (query chunk, KV head): the final log-sum-exp, the
       importance (the tiles' sums rescaled, summed over the group's heads), path-specific blocks,
       candidates, forced blocks, top-n with ties to the lower index, ascending compaction;
       two-sweep form (longer rows, where the per-head sums' traffic costs more than a second sweep):
    2. `nsa_route_imp_fwd_kernel`  (the score launch's grid): the final log-sum-exp, then the
       importance of a range of whole selection blocks from a second sweep of the keys;
    3. `nsa_route_topk_fwd_kernel` (query chunk, KV head): path-specific blocks, candidates, forced
       blocks, top-n.
The launches read the prefix length from device memory when it is given as a tensor.
"""
from __future__ import annotations

from typing import Optional

import torch

from ssv.config import NSAConfig
from ssv.ops.nsa.route_split_kernels import (nsa_route_imp_fwd_kernel, nsa_route_merge_topk_fwd_kernel,
                                             nsa_route_score_fwd_kernel, nsa_route_topk_fwd_kernel)
from ssv.ops.nsa.route_policy import path_window, plan_route
from ssv.ops.pdl import pdl_args
from ssv.ops.utils import kv_descriptors, pow2, sm_count


def nsa_route(q: torch.Tensor, k_cmp: torch.Tensor, v_cmp: torch.Tensor, n_prefix_blocks, k: torch.Tensor,
              v: torch.Tensor, w: torch.Tensor, s0, n_path: torch.Tensor, positions: torch.Tensor, cfg: NSAConfig,
              want_o: bool = False, scale: Optional[float] = None, max_rows: int = 64,
              n_split: Optional[int] = None, max_pos: Optional[int] = None, one_sweep: Optional[bool] = None,
              tma: Optional[bool] = None, topk_tail: Optional[bool] = None, topk_warps: Optional[int] = None):
    """Routing of N queries. k_cmp/v_cmp [Hkv, >=NBpre, D] shared prefix blocks; k/v [Hkv, L, D] the
    cache (the step's new tokens in their slots); w [N, NBP, S] the path-specific blocks' weights over
    the slots [s0, s0 + S) (`path_block_weights`, or the device plan's), n_path[q] of them complete
    for query q. The path blocks' keys are never formed: their scores are weighted sums of the slots'
    (`path_blocks_torch` is the product they stand for); values are read for o_cmp (want_o) alone.

    n_prefix_blocks / s0: ints, or int32 [1] device tensors (a graph replays at any length; the
    launch is then sized for all of k_cmp's blocks). max_pos: a bound on the largest position
    (given, no device sync happens: CUDA-graph capturable; a larger bound selects the same blocks).
    one_sweep / n_split / max_rows / topk_tail / topk_warps: the launch form (route_policy.plan_route
    decides when None).
    tma: the compressed key / value tiles through tensor descriptors (default: on Hopper or newer,
    where k_cmp / v_cmp are 16-byte aligned; the CPU tests force it through the interpreter).
    Returns (block_indices [N, Hkv, n] int32, importance [N, Hkv, NBs], lse_cmp [N, Hq], o_cmp [N, Hq, D] or None).
    """
    q = q.contiguous()
    n, hq, d = q.shape
    hkv = k_cmp.shape[0]
    g = hq // hkv
    dev = q.device
    scale = d ** -0.5 if scale is None else scale
    if w.dim() != 3 or w.shape[0] != n or w.dtype != torch.float32:
        raise ValueError(f"nsa_route: path weights must be fp32 [{n}, NBP, S], got {tuple(w.shape)} {w.dtype}")
    if k.shape[0] != hkv or k.shape[2] != d or k.stride(2) != 1 or v.stride() != k.stride():
        raise ValueError("nsa_route: k and v must be [Hkv, L, D] with equal strides and a contiguous last dimension")
    nbp = w.shape[1]
    n_slots = w.shape[2] if nbp else 0   # no path block: no slot tile to sweep
    wc = w.contiguous() if w.numel() else torch.zeros(n, 1, 1, device=dev, dtype=torch.float32)
    if isinstance(n_prefix_blocks, torch.Tensor):
        nbpre_t, nbpre = n_prefix_blocks, k_cmp.shape[1]   # sized for the capacity, read in the kernels
    else:
        nbpre = int(n_prefix_blocks)
        nbpre_t = torch.full((1,), nbpre, device=dev, dtype=torch.int32)
    s0_t = s0 if isinstance(s0, torch.Tensor) else torch.full((1,), int(s0), device=dev, dtype=torch.int32)
    max_pos = int(positions.max()) if max_pos is None else int(max_pos)  # pass it to stay sync-free
    nbs = max_pos // cfg.slc_block + 1
    lp = plan_route(n, hq, hkv, nbpre, nbs, cfg, sm_count(dev), max_rows, n_split, n_slots, one_sweep,
                    topk_tail, topk_warps)
    r, a, sb = lp.r, lp.a, lp.sb
    nbpp = pow2(max(nbp, 1), 1)   # path blocks
    f32 = dict(device=dev, dtype=torch.float32)
    npath = n_path.to(dev, torch.int32).contiguous()   # no copy when already so
    pos = positions if positions.dtype in (torch.int32, torch.int64) else positions.to(torch.int32)
    pos = pos.to(dev).contiguous()   # no copy when the plan already holds it on the device
    imp = torch.empty(n, hkv, nbs, **f32)   # each selection block's own part, then the importance
    tail = torch.empty(n, hkv, nbs, **f32) if a > 1 else imp
    pp = torch.empty(n, hkv, max(nbp, 1), **f32)
    idx = torch.empty(n, hkv, cfg.n_select, device=dev, dtype=torch.int32)
    lse = torch.empty(n, hq, **f32)
    o_cmp = torch.empty(n, hq, d, **f32) if want_o else lse
    # descriptors by default (H200, route-s33: 64K/64 score + imp 35.4 -> 33.5 us, 128K 57.8 -> 52.7;
    # within 0.2 us at the default model's shapes)
    kd, vd, tma = kv_descriptors(k_cmp, v_cmp, k_cmp.shape[1], lp.bc, tma, "nsa_route")   # the whole capacity
    rows = dict(G=g, CR=lp.cr, BM=lp.bm, D=d, BC=lp.bc, WANT_O=want_o, GP=lp.gp, TMA=tma)
    top = dict(LS=cfg.slc_block, BJ=lp.bj, NSEL=cfg.n_select, NSELP=lp.nselp, SORTED=lp.sorted_topk,
               FORCED_FIRST=cfg.forced_first, FORCED_LOCAL=cfg.forced_local, NW=path_window(nbpp, r, a))
    cache = (k, v, wc, s0_t, npath, nbpre_t)
    kst = (q.stride(0), q.stride(1), k_cmp.stride(0), k_cmp.stride(1))
    pst = (k.stride(0), k.stride(1), wc.stride(0), wc.stride(1))
    ist = (imp.stride(0), imp.stride(1), pp.stride(0), pp.stride(1))
    xst = (idx.stride(0), idx.stride(1))
    pk = pdl_args(q.device)   # programmatic dependent launch on Hopper (ssv/ops/pdl.py)
    nst = lp.n_split + nbp   # the compressed sweep's splits, then one a path block
    m_part = torch.empty(nst, n, hq, **f32)
    l_part = torch.empty(nst, n, hq, **f32)
    a_part = torch.empty(nst, n, hq, d, **f32) if want_o else m_part
    sp = torch.empty(n, hq, nbpp, **f32)   # the path blocks' raw scores, launch 1 to launch 2
    grid = (lp.n_groups, hkv, nst)
    if not lp.one_sweep:
        nsa_route_score_fwd_kernel[grid](
            q, k_cmp, v_cmp, kd, vd, *cache, sp, m_part, l_part, a_part, imp, tail, lse, n, nbp, lp.n_split, nbs, n_slots,
            k.shape[1], float(scale), *kst, *pst, hq, 0, 0, **rows, R=r, A=a, SB=sb, NBPP=nbpp, SUMS=False,
            **pk, num_warps=4)
        nsa_route_imp_fwd_kernel[grid](
            q, k_cmp, kd, npath, nbpre_t, sp, m_part, l_part, a_part, imp, tail, pp, o_cmp, lse, n, nbs, lp.n_split,
            float(scale), *kst, hq, *ist, R=r, A=a, **rows, NBPP=nbpp, NSP=pow2(nst, 2), **pk,
            num_warps=4)
        nsa_route_topk_fwd_kernel[(-(-n // lp.qc), hkv)](
            imp, tail, pp, npath, nbpre_t, pos, idx, n, nbs, *ist, *xst, QC=lp.qc, R=r, A=a, **top, NBPP=nbpp,
            BT=lp.bt, **pk, num_warps=lp.topk_warps)
        return idx, imp, lse, (o_cmp if want_o else None)
    own_h = torch.empty(n, hq, nbs, **f32)  # per head, against its tile's max mt
    tail_h = torch.empty(n, hq, nbs, **f32) if a > 1 else own_h
    mt = torch.empty(n, hq, -(-max(nbpre, 1) // lp.bc), **f32)
    hst = (own_h.stride(1), mt.stride(1))
    nsa_route_score_fwd_kernel[grid](
        q, k_cmp, v_cmp, kd, vd, *cache, sp, m_part, l_part, a_part, own_h, tail_h, mt, n, nbp, lp.n_split, nbs, n_slots,
        k.shape[1], float(scale), *kst, *pst, hq, *hst, **rows, R=r, A=a, SB=sb, NBPP=nbpp, SUMS=True, **pk,
        num_warps=4)
    nsa_route_merge_topk_fwd_kernel[(-(-n // lp.qc), hkv)](
        own_h, tail_h, mt, sp, m_part, l_part, a_part, imp, tail, pp, npath, nbpre_t, pos, idx, o_cmp, lse,
        n, nbp, nbs, nst, hq, *hst, *ist, *xst, G=g, D=d, BC=lp.bc, WANT_O=want_o, NSP=pow2(nst, 2), QC=lp.qc,
        R=r, A=a, **top, NBPP=nbpp, **pk, num_warps=lp.topk_warps)
    return idx, imp, lse, (o_cmp if want_o else None)


def path_block_weights(prefix_len: int, positions: torch.Tensor, tree_mask: torch.Tensor, cfg: NSAConfig):
    """Per step (shared by all layers): how each query's path-specific compression blocks average the cache.

    Returns (w [N, NBP, S] with S = slots [s0, P+N), s0, n_path [N]); a block's key is w @ k[:, s0:].
    """
    from ssv.ops.nsa.naive import num_cmp_blocks
    P, n = int(prefix_len), positions.numel()
    dev = positions.device
    nb_pre = num_cmp_blocks(P, cfg)
    nb_all = num_cmp_blocks(int(positions.max()) + 1, cfg)
    s0 = nb_pre * cfg.cmp_stride
    pos_slot = torch.cat([torch.arange(s0, P, device=dev), positions.long()])
    vis = torch.cat([torch.ones(n, P - s0, dtype=torch.bool, device=dev), tree_mask.bool()], 1)
    start = torch.arange(nb_pre, nb_all, device=dev) * cfg.cmp_stride
    memb = (pos_slot[None] >= start[:, None]) & (pos_slot[None] < start[:, None] + cfg.cmp_block)
    w = (vis[:, None, :] & memb[None]).float() / cfg.cmp_block
    n_path = torch.tensor([num_cmp_blocks(int(p) + 1, cfg) - nb_pre for p in positions.tolist()],
                          device=dev, dtype=torch.int32)
    return w, s0, n_path


def path_block_weights_device(plen: torch.Tensor, positions: torch.Tensor, tree_mask: torch.Tensor,
                              cfg: NSAConfig):
    """`path_block_weights` with the prefix length read from a device tensor and fixed shapes (no
    host sync, so a captured graph replays at any length): w [N, N // d + 1, l + N] over the slots
    [s0, s0 + l + N) (zero past the step's last slot), s0 [1] int32, n_path [N] int32.

    The step's slots past P - s0 < l committed ones are its N new tokens; a block of path b starts
    at s0 + b * d and is complete within P + N only for b <= N // d.
    """
    l, st = cfg.cmp_block, cfg.cmp_stride
    n = positions.numel()
    dev = positions.device
    P = plen.reshape(()).long()
    nb_pre = torch.where(P >= l, (P - l) // st + 1, torch.zeros_like(P))
    s0 = nb_pre * st
    j = torch.arange(l + n, device=dev)
    slot = s0 + j
    node = (slot - P).clamp(0, n - 1)
    new = (slot >= P) & (slot < P + n)
    pos_slot = torch.where(new, positions.long()[node], slot)                        # [S]
    vis = torch.where(new[None], tree_mask.bool()[:, node], (slot < P)[None])        # [N, S]
    start = s0 + torch.arange(n // st + 1, device=dev) * st                          # [NBP]
    memb = (pos_slot[None] >= start[:, None]) & (pos_slot[None] < start[:, None] + l)
    w = (vis[:, None, :] & memb[None]).float() / l
    pos1 = positions.long() + 1
    n_path = torch.where(pos1 >= l, (pos1 - l) // st + 1, torch.zeros_like(pos1)) - nb_pre
    return w, s0.to(torch.int32).reshape(1), n_path.clamp_min(0).to(torch.int32)


def path_blocks_torch(w: torch.Tensor, s0: int, k: torch.Tensor, v: torch.Tensor, prefix_len: int, n: int):
    """The path-specific compressed keys and values w @ k[:, s0:] in plain PyTorch: the product whose
    scores the routing kernels compute without forming it (and a check of the weights)."""
    kt, vt = k[:, s0:prefix_len + n].float(), v[:, s0:prefix_len + n].float()
    kp = torch.einsum("nbs,hsd->nhbd", w, kt)
    vp = torch.einsum("nbs,hsd->nhbd", w, vt)
    if kp.shape[2] == 0:
        kp = kp.new_zeros(kp.shape[0], kp.shape[1], 1, kp.shape[3])
        vp = torch.zeros_like(kp)
    return kp, vp
