"""NSA routing for a batch of verification queries: compressed attention, importance, top-n.

The launcher (kernels in route_kernels.py, launch policy in route_policy.py). Two forms:
  fused (short caches): one launch, grid (query group, KV head): the compressed softmax, each
    selection block's importance and the top-n of the program's queries;
  split (long caches), flash-decoding style so that the keys spread over the whole GPU:
    1. `nsa_route_lse_fwd_kernel`  (query group, KV head, split): partial softmax states;
    2. `nsa_route_imp_fwd_kernel`  (query group, KV head, split): the final log-sum-exp, then the
       importance of a range of whole selection blocks;
    3. `nsa_route_topk_fwd_kernel` (query chunk, KV head): path-specific blocks, candidates, forced
       blocks, top-n with ties to the lower index, ascending compaction.
Both read the prefix length from device memory when it is given as a tensor.
"""
from __future__ import annotations

from typing import Optional

import torch

from ssv.config import NSAConfig
from ssv.ops.nsa.route_kernels import (nsa_path_blocks_fwd_kernel, nsa_route_fused_fwd_kernel,
                                       nsa_route_imp_fwd_kernel, nsa_route_lse_fwd_kernel,
                                       nsa_route_topk_fwd_kernel)
from ssv.ops.nsa.route_policy import plan_route
from ssv.ops.utils import pow2, sm_count


def nsa_route(q: torch.Tensor, k_cmp: torch.Tensor, v_cmp: torch.Tensor, n_prefix_blocks,
              k_path: torch.Tensor, v_path: Optional[torch.Tensor], n_path: torch.Tensor, positions: torch.Tensor,
              cfg: NSAConfig, want_o: bool = False, scale: Optional[float] = None, max_rows: int = 64,
              n_split: Optional[int] = None, max_pos: Optional[int] = None, fused: Optional[bool] = None):
    """Routing of N queries. k_cmp/v_cmp [Hkv, >=NBpre, D] shared prefix blocks; k_path/v_path
    [N, Hkv, NBP, D] path-specific blocks (n_path[q] of them complete for query q); v_path may be
    None unless want_o (the values feed o_cmp alone: `path_blocks(values=False)`).

    n_prefix_blocks: an int, or an int32 [1] device tensor (a graph replays at any length; the
    launch is then sized for all of k_cmp's blocks). max_pos: a bound on the largest position
    (given, no device sync happens: CUDA-graph capturable; a larger bound selects the same blocks).
    fused / n_split / max_rows: the launch form (route_policy.plan_route decides when None).
    Returns (block_indices [N, Hkv, n] int32, importance [N, Hkv, NBs], lse_cmp [N, Hq], o_cmp [N, Hq, D] or None).
    """
    q = q.contiguous()
    n, hq, d = q.shape
    hkv = k_cmp.shape[0]
    g = hq // hkv
    dev = q.device
    scale = d ** -0.5 if scale is None else scale
    nbp = k_path.shape[2]
    if isinstance(n_prefix_blocks, torch.Tensor):
        nbpre_t, nbpre = n_prefix_blocks, k_cmp.shape[1]   # sized for the capacity, read in the kernels
    else:
        nbpre = int(n_prefix_blocks)
        nbpre_t = torch.full((1,), nbpre, device=dev, dtype=torch.int32)
    max_pos = int(positions.max()) if max_pos is None else int(max_pos)  # pass it to stay sync-free
    nbs = max_pos // cfg.slc_block + 1
    lp = plan_route(n, hq, hkv, nbpre, nbs, cfg, sm_count(dev), max_rows, n_split, fused)
    r, a = lp.r, lp.a
    f32 = dict(device=dev, dtype=torch.float32)
    npath = n_path.to(dev, torch.int32).contiguous()   # no copy when already so
    pos = positions if positions.dtype in (torch.int32, torch.int64) else positions.to(torch.int32)
    pos = pos.to(dev).contiguous()   # no copy when the plan already holds it on the device
    if v_path is None and want_o:
        raise ValueError("nsa_route: want_o needs the path blocks' values")
    kp = k_path.contiguous()
    vp = kp if v_path is None else v_path.contiguous()   # values read only for o_cmp
    imp = torch.empty(n, hkv, nbs, **f32)   # each selection block's own part, then the importance
    tail = torch.empty(n, hkv, nbs, **f32) if a > 1 else imp
    pp = torch.empty(n, hkv, nbp, **f32)
    idx = torch.empty(n, hkv, cfg.n_select, device=dev, dtype=torch.int32)
    lse = torch.empty(n, hq, **f32)
    o_cmp = torch.empty(n, hq, d, **f32) if want_o else lse
    rows = dict(G=g, CR=lp.cr, BM=lp.bm, D=d, BC=lp.bc, WANT_O=want_o, GP=lp.gp)
    top = dict(LS=cfg.slc_block, BJ=lp.bj, NSEL=cfg.n_select, NSELP=lp.nselp, SORTED=lp.sorted_topk,
               FORCED_FIRST=cfg.forced_first, FORCED_LOCAL=cfg.forced_local)
    kst = (q.stride(0), q.stride(1), k_cmp.stride(0), k_cmp.stride(1), kp.stride(0), kp.stride(1), kp.stride(2), hq)
    ist = (imp.stride(0), imp.stride(1), pp.stride(0), pp.stride(1))
    xst = (idx.stride(0), idx.stride(1))
    if lp.fused:
        nsa_route_fused_fwd_kernel[(lp.n_groups, hkv)](
            q, k_cmp, v_cmp, kp, vp, npath, nbpre_t, pos, imp, tail, pp, idx, o_cmp, lse, n, nbp, nbs, float(scale),
            *kst, *ist, *xst, R=r, A=a, QC=lp.qc, **rows, **top, num_warps=4)
        return idx, imp, lse, (o_cmp if want_o else None)
    m_part = torch.empty(lp.n_split, n, hq, **f32)
    l_part = torch.empty(lp.n_split, n, hq, **f32)
    a_part = torch.empty(lp.n_split, n, hq, d, **f32) if want_o else m_part
    grid = (lp.n_groups, hkv, lp.n_split)
    nsa_route_lse_fwd_kernel[grid](
        q, k_cmp, v_cmp, kp, vp, npath, nbpre_t, m_part, l_part, a_part, n, nbp, float(scale), *kst, **rows,
        num_warps=4)
    nsa_route_imp_fwd_kernel[grid](
        q, k_cmp, kp, npath, nbpre_t, m_part, l_part, a_part, imp, tail, pp, o_cmp, lse, n, nbp, nbs, float(scale),
        *kst, *ist, R=r, A=a, **rows, num_warps=4)
    nsa_route_topk_fwd_kernel[(-(-n // lp.qc), hkv)](
        imp, tail, pp, npath, nbpre_t, pos, idx, n, nbs, *ist, *xst, QC=lp.qc, R=r, A=a, **top,
        num_warps=lp.topk_warps)
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
    """The same product in plain PyTorch (the CPU path and the kernel's reference)."""
    kt, vt = k[:, s0:prefix_len + n].float(), v[:, s0:prefix_len + n].float()
    kp = torch.einsum("nbs,hsd->nhbd", w, kt)
    vp = torch.einsum("nbs,hsd->nhbd", w, vt)
    if kp.shape[2] == 0:
        kp = kp.new_zeros(kp.shape[0], kp.shape[1], 1, kp.shape[3])
        vp = torch.zeros_like(kp)
    return kp, vp


def path_blocks(w: torch.Tensor, s0, k: torch.Tensor, v: torch.Tensor, prefix_len, n: int,
                kernel: Optional[bool] = None, out: Optional[tuple] = None, values: bool = True):
    """k, v [Hkv, L, D] -> k_path, v_path [N, Hkv, NBP, D] fp32 (NBP >= 1 so the kernels get a real pointer).

    kernel (default: on CUDA): one launch instead of slicing, casting and two einsums per layer.
    s0 / prefix_len: ints, or (kernel only) device tensors as `path_block_weights_device` returns
    them, w then covering a fixed number of slots from s0 (zero weight past the step).
    values: False computes the keys alone (routing reads the values only for gated NSA's
    compressed branch) and returns v_path as None.
    """
    kernel = k.is_cuda if kernel is None else kernel
    if not kernel:
        kp, vp = path_blocks_torch(w, int(s0), k, v, int(prefix_len), n)
        return kp, (vp if values else None)
    nq, nbp, S = w.shape
    hkv, _, d = k.shape
    if isinstance(s0, torch.Tensor):
        s0_t = s0
    else:
        if S != prefix_len + n - s0:
            raise ValueError(f"path weights cover {S} slots, the step has {prefix_len + n - s0} from slot {s0}")
        s0_t = torch.full((1,), int(s0), device=k.device, dtype=torch.int32)
    if k.stride(2) != 1 or v.stride() != k.stride():
        raise ValueError("k and v must share strides with a contiguous last dimension")
    if out is None:  # every entry is written when there are path blocks; else one zero block (never read)
        new = torch.empty if nbp else torch.zeros
        out = tuple(new(nq, hkv, max(nbp, 1), d, device=k.device, dtype=torch.float32) for _ in range(2))
    kp, vp = out
    if kp.shape != (nq, hkv, max(nbp, 1), d) or vp.stride() != kp.stride() or kp.dtype != torch.float32:
        raise ValueError(f"path-block outputs must be two fp32 [{nq}, {hkv}, {max(nbp, 1)}, {d}] with equal strides")
    if nq and nbp:
        wc = w.contiguous()
        nbpp = pow2(nbp)
        nsa_path_blocks_fwd_kernel[(nq, hkv)](
            wc, k, v, kp, vp, s0_t, S, nbp, k.shape[1], wc.stride(0), wc.stride(1), k.stride(0), k.stride(1),
            kp.stride(0), kp.stride(1), kp.stride(2), BSB=64, D=d, NBPP=nbpp, WANT_V=bool(values),
            num_warps=4)
    return kp, (vp if values else None)
