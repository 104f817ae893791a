"""Launcher of the fused context lookup and chain attachment: two launches where `context_lookup` and
`attach_chain_device` (ssv.spec.lookup) are ~290 small ops, graph-safe (the text's length is read on
the device, never on the host)."""
from __future__ import annotations

import torch
import triton

from ssv.ops.lookup.kernels import lookup_attach_fwd_kernel, lookup_match_fwd_kernel
from ssv.ops.pdl import pdl_args
from ssv.ops.utils import pow2

NGRAMS = (2, 4)      # ssv.spec.lookup.NGRAMS (not imported: ssv.spec imports ssv.ops)
MAX_K = 16           # chain tokens (SpecOptions.lookup's bound)
MAX_NODES = 128      # T + K: the tree and its new slots in one program's registers ([16, 128] tiles)
MAX_NGRAM = 8        # the longest suffix tried (the match kernel unrolls n loads a suffix length)


def lookup_workspace(ngrams: tuple = NGRAMS, device=None) -> torch.Tensor:
    """The match kernel's best[] workspace: int64 [hi - lo + 1], all -1. The attach kernel leaves it
    at -1 again, so a caller allocates it once and passes it to every launch (a graph replays it)."""
    lo, hi = _ngrams(ngrams)
    return torch.full((hi - lo + 1,), -1, dtype=torch.long, device=device)


def lookup_buffers(T: int, K: int, device=None):
    """Output buffers for `lookup_attach(out=)`: (tokens, parents, scores, depth, mask, pos) of
    T + K nodes: int64, int64, float32, int64 [T + K], bool [T + K, T + K], int64 [T + K]."""
    n = T + K
    tokens, parents, depth, pos = torch.empty(4, n, dtype=torch.long, device=device)
    return (tokens, parents, torch.empty(n, dtype=torch.float32, device=device), depth,
            torch.empty(n, n, dtype=torch.bool, device=device), pos)


def _ngrams(ngrams):
    lo, hi = (int(x) for x in ngrams)
    if not 1 <= lo <= hi <= MAX_NGRAM:
        raise ValueError(f"lookup_attach: ngrams must be 1 <= lo <= hi <= {MAX_NGRAM}, got {tuple(ngrams)}")
    return lo, hi


def _check(name: str, x, shape: tuple, dtype, dev) -> None:
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"lookup_attach: {name} must be a tensor")
    want = "float" if dtype is None else str(dtype).replace("torch.", "")
    if (tuple(x.shape) != shape or (x.dtype != dtype if dtype is not None else not x.dtype.is_floating_point)
            or not x.is_contiguous() or x.device != dev):
        raise ValueError(f"lookup_attach: {name} must be a contiguous {want} {list(shape)} on {dev}, got "
                         f"{x.dtype} {list(x.shape)} on {x.device}" + ("" if x.is_contiguous() else " (strided)"))


def _span(x: torch.Tensor):
    a = x.data_ptr()
    return a, a + x.numel() * x.element_size()


def lookup_attach(hist: torch.Tensor, length, tree, mask: torch.Tensor, pos: torch.Tensor, spare, K: int,
                  best: torch.Tensor = None, out: tuple = None, ngrams: tuple = NGRAMS, length_offset: int = 0,
                  block: int = 1024, num_warps: int = 4):
    """`attach_chain_device(tree, mask, pos, spare, *context_lookup(hist, length, K, ngrams))` (the
    fixed-shape form, compact=False) in two launches: the match over the buffer (grid over hist in
    `block`-sized blocks), then the attachment (one program).

    hist [S] int64: the text's tokens by position (entries past the text's end ignored); length [1]
    int64 or int32 on hist's device: the text's token count is length + length_offset (the root is
    hist[length + length_offset - 1]: the cache's dlen with length_offset=1 needs no add before the
    launch; a Python int is taken too, copied to the device: not graph-safe); tree: a DeviceTree of
    T nodes (tokens, parents, depth int64, scores float32) with its ancestor mask [T, T] bool and
    positions pos [T] int64; spare: K spares (a DeviceTree whose parents index the T nodes or, as
    T + i, spare i; scores any float); 1 <= K <= 16, T + K <= 128.
    best: the workspace (`lookup_workspace`: int64 [hi - lo + 1] at -1; left at -1), allocated here
    when None; out: (tokens, parents, scores, depth, mask, pos) buffers of T + K nodes
    (`lookup_buffers`), allocated when None, apart from every input. With both passed nothing is
    allocated. Returns (DeviceTree of T + K nodes, mask [T + K, T + K], pos [T + K])."""
    from ssv.spec.device import DeviceTree   # lazily: ssv.spec imports ssv.ops
    lo, hi = _ngrams(ngrams)
    if not isinstance(K, int) or not 1 <= K <= MAX_K:
        raise ValueError(f"lookup_attach: K must be an int in [1, {MAX_K}], got {K!r}")
    if not isinstance(hist, torch.Tensor) or hist.dim() != 1 or hist.numel() < 1:
        raise ValueError("lookup_attach: hist must be a 1-D tensor [S], S >= 1")
    S, dev = hist.numel(), hist.device
    _check("hist", hist, (S,), torch.long, dev)
    if not isinstance(length, torch.Tensor):
        length = torch.tensor([int(length)], dtype=torch.long, device=dev)
    if length.dtype not in (torch.int32, torch.long):
        raise ValueError(f"lookup_attach: length must be int32 or int64, got {length.dtype}")
    _check("length", length.reshape(-1) if length.dim() == 0 else length, (1,), length.dtype, dev)
    if not isinstance(length_offset, int) or abs(length_offset) > 2 ** 30:
        raise ValueError(f"lookup_attach: length_offset must be a small int, got {length_offset!r}")
    T = tree.tokens.numel()
    if T < 1 or T + K > MAX_NODES:
        raise ValueError(f"lookup_attach: a tree of {T} nodes and {K} chain slots; 1 <= T and T + K <= {MAX_NODES}")
    for name, x, dt in (("tokens", tree.tokens, torch.long), ("parents", tree.parents, torch.long),
                        ("scores", tree.scores, torch.float32), ("depth", tree.depth, torch.long)):
        _check(f"tree.{name}", x, (T,), dt, dev)
    _check("mask", mask, (T, T), torch.bool, dev)
    _check("pos", pos, (T,), torch.long, dev)
    for name, x, dt in (("tokens", spare.tokens, torch.long), ("parents", spare.parents, torch.long),
                        ("scores", spare.scores, None), ("depth", spare.depth, torch.long)):
        _check(f"spare.{name}", x, (K,), dt, dev)
    n = T + K
    if best is None:
        best = lookup_workspace((lo, hi), dev)
    _check("best", best, (hi - lo + 1,), torch.long, dev)
    if out is None:
        out = lookup_buffers(T, K, dev)
    if len(out) != 6:
        raise ValueError("lookup_attach: out must be (tokens, parents, scores, depth, mask, pos)")
    o_tok, o_par, o_sc, o_dep, o_mask, o_pos = out
    for name, x, shape, dt in (("tokens", o_tok, (n,), torch.long), ("parents", o_par, (n,), torch.long),
                               ("scores", o_sc, (n,), torch.float32), ("depth", o_dep, (n,), torch.long),
                               ("mask", o_mask, (n, n), torch.bool), ("pos", o_pos, (n,), torch.long)):
        _check(f"out {name}", x, shape, dt, dev)
    ins = [hist, length, best, mask, pos, *vars(tree).values(), *vars(spare).values()]
    spans = [_span(x) for x in ins]
    outs = [_span(x) for x in out]
    for i, (a, b) in enumerate(outs):
        if any(a < d and c < b for c, d in spans) or any(a < d and c < b for c, d in outs[:i]):
            raise ValueError("lookup_attach: the out buffers must not overlap each other or an input")
    if not (isinstance(block, int) and 16 <= block <= 4096 and block & (block - 1) == 0):
        raise ValueError(f"lookup_attach: block must be a power of two in [16, 4096], got {block!r}")
    nhi = min(hi, S - 1)   # as context_lookup: a suffix shorter than the buffer
    pk = pdl_args(dev)
    lookup_match_fwd_kernel[(triton.cdiv(S, block),)](hist, length, best, S=S, OFF=length_offset, NLO=lo,
                                                      NHI=nhi, BS=block, **pk, num_warps=num_warps)
    lookup_attach_fwd_kernel[(1,)](hist, length, best, tree.tokens, tree.parents, tree.scores, tree.depth, mask,
                                   pos, spare.tokens, spare.parents, spare.scores, spare.depth,
                                   o_tok, o_par, o_sc, o_dep, o_mask, o_pos, S=S, OFF=length_offset, T=T, K=K,
                                   NLO=lo, NHI=nhi, BN=pow2(n), BK=pow2(K), BR=16, **pk, num_warps=num_warps)
    return DeviceTree(o_tok, o_par, o_sc, o_dep), o_mask, o_pos
