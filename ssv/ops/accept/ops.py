"""Launchers of the tree walks: greedy (one launch where the tensor walk takes ~100) and sampled (three
launches after `probs_rows`, which gives the target's probabilities with their rows' masses, or four after
probabilities without them; the tensor form takes ~115 with the record); an AR step's sampled token with the
walk's bonus launches (`sample_row`)."""
from __future__ import annotations

from typing import Optional

import torch
import triton

from ssv.ops.accept.kernels import (accept_greedy_fwd_kernel, accept_sample_fwd_kernel, bonus_mass_fwd_kernel,
                                   bonus_pick_fwd_kernel, logits_mass_fwd_kernel, logits_pick_fwd_kernel,
                                   probs_rows_fwd_kernel, row_mass_fwd_kernel)
from ssv.ops.pdl import pdl_args

MAX_T = 1024
BONUS_CHUNK = 1024   # the bonus's inverse CDF: chunk masses in parallel, then a scan of one chunk
# a row's fp64 mass, one program a row: its loop is a chain of dependent loads (1,024-token tiles: 48 steps and
# 16.9 us at the default round's 51 x 49,152 on an H100), so wide tiles (6 steps)
ROW_MASS_TILE = 8192
PROBS_TILE = 4096   # `probs_rows`: a program a row, two passes (the second from L2)


def probs_rows(logits: torch.Tensor, inv_temperature, probs: Optional[torch.Tensor] = None,
               total: Optional[torch.Tensor] = None) -> tuple:
    """softmax(logits * inv_temperature) by rows, `ssv.spec.accept.probs_unchecked` for a setting without
    top-p (its twin, equal to float rounding), and each row's fp64 mass as `accept_sample_round` needs it, in
    one launch where the tensor form takes three (the scale, the softmax, the masses). logits [T, V] float
    with a contiguous last dimension; inv_temperature a float or a device scalar (`DeviceSampling`'s, which
    a graph reads). Returns (probs [T, V] fp32, total [T] fp64), into `probs` / `total` when given."""
    if logits.dim() != 2 or logits.shape[0] == 0 or logits.shape[1] == 0 or not logits.is_floating_point() \
            or logits.stride(1) != 1:
        raise ValueError(f"probs_rows: logits must be a float [T, V] with T, V > 0 and a contiguous last dimension, "
                         f"got {tuple(logits.shape)} {logits.dtype}")
    t, v = logits.shape
    dev = logits.device
    if not isinstance(inv_temperature, torch.Tensor):
        if not 0 < float(inv_temperature) < float("inf"):
            raise ValueError(f"probs_rows: inv_temperature must be finite and > 0, got {inv_temperature}")
        inv_temperature = torch.full((1,), float(inv_temperature), dtype=torch.float32, device=dev)
    elif inv_temperature.numel() != 1 or inv_temperature.device != dev:
        raise ValueError(f"probs_rows: inv_temperature must be one value on {dev}")
    probs = torch.empty(t, v, dtype=torch.float32, device=dev) if probs is None else probs
    total = torch.empty(t, dtype=torch.float64, device=dev) if total is None else total
    if probs.shape != (t, v) or probs.dtype != torch.float32 or probs.stride(1) != 1:
        raise ValueError(f"probs_rows: probs must be fp32 [{t}, {v}] with a contiguous last dimension")
    if total.shape != (t,) or total.dtype != torch.float64:
        raise ValueError(f"probs_rows: total must be fp64 [{t}]")
    probs_rows_fwd_kernel[(t,)](logits, inv_temperature, probs, total, v, logits.stride(0), probs.stride(0),
                                BV=PROBS_TILE, **pdl_args(dev), num_warps=8)
    return probs, total


def accept_greedy_walk(parents: torch.Tensor, tokens: torch.Tensor, scores: torch.Tensor, best: torch.Tensor,
                       max_depth: int):
    """parents/tokens [T] int64, scores [T] float, best [T] int64 (the target's argmax at each node) ->
    (path [max_depth + 1] -1 padded, length [1], bonus [1]) as `ssv.spec.device_accept.accept_greedy_device`."""
    t = parents.numel()
    if not (tokens.numel() == scores.numel() == best.numel() == t) or not 0 < t <= MAX_T:
        raise ValueError(f"accept_greedy_walk: parents, tokens, scores, best must be [T] with 0 < T <= {MAX_T}")
    dev = parents.device
    path = torch.empty(max_depth + 1, dtype=torch.long, device=dev)
    length = torch.empty(1, dtype=torch.long, device=dev)
    bonus = torch.empty(1, dtype=torch.long, device=dev)
    accept_greedy_fwd_kernel[(1,)](parents.contiguous(), tokens.contiguous(), scores.contiguous(),
                                   best.contiguous(), path, length, bonus, path, path, T=t,
                                   BT=max(16, triton.next_power_of_2(t)), D=max_depth,
                                   BD=max(16, triton.next_power_of_2(max_depth + 1)), RECORD=False,
                                   **pdl_args(dev), num_warps=1)
    return path, length, bonus


def accept_greedy_round(parents: torch.Tensor, tokens: torch.Tensor, scores: torch.Tensor, best: torch.Tensor,
                        max_depth: int, length: torch.Tensor, nxt: torch.Tensor, bonus: torch.Tensor):
    """`accept_greedy_walk` and the round's record in the same launch, written into the caller's
    buffers (the engine's record and root token: no copies after it): length [1], nxt [max_depth + 1]
    the token after each path row (the next accepted token, the bonus after the last), bonus [1].
    Returns (path [max_depth + 1], rows [max_depth + 1]: the path with padding at the root)."""
    t, d = parents.numel(), max_depth
    if not (tokens.numel() == scores.numel() == best.numel() == t) or not 0 < t <= MAX_T:
        raise ValueError(f"accept_greedy_round: parents, tokens, scores, best must be [T] with 0 < T <= {MAX_T}")
    for name, x, n in (("length", length, 1), ("nxt", nxt, d + 1), ("bonus", bonus, 1)):
        if x.dtype != torch.long or x.numel() != n or (n > 1 and x.stride(0) != 1):
            raise ValueError(f"accept_greedy_round: {name} must be a contiguous int64 [{n}]")
    dev = parents.device
    path = torch.empty(d + 1, dtype=torch.long, device=dev)
    rows = torch.empty(d + 1, dtype=torch.long, device=dev)
    accept_greedy_fwd_kernel[(1,)](parents.contiguous(), tokens.contiguous(), scores.contiguous(),
                                   best.contiguous(), path, length, bonus, rows, nxt, T=t,
                                   BT=max(16, triton.next_power_of_2(t)), D=d,
                                   BD=max(16, triton.next_power_of_2(d + 1)), RECORD=True,
                                   **pdl_args(dev), num_warps=1)
    return path, rows


def accept_sample_round(parents: torch.Tensor, tokens: torch.Tensor, scores: torch.Tensor, probs: torch.Tensor,
                        coins: torch.Tensor, max_depth: int, top_k: int, length: torch.Tensor, nxt: torch.Tensor,
                        bonus: torch.Tensor, total: Optional[torch.Tensor] = None):
    """The sampled walk (`ssv.spec.device_accept.accept_sample_device`: the same path and bonus for the same
    coins) and the round's record, written into the caller's length [1], nxt [max_depth + 1] and
    bonus [1] as `accept_greedy_round`. probs [T, V] fp32 (the target's, `probs_unchecked`), which
    this consumes: the stop node's tried tokens are zeroed in its row. coins [>= T, top_k + 1].
    Four launches: the rows' masses, the walk, the bonus's chunk masses, the bonus; three when the caller has
    the rows' fp64 masses (total, from `probs_rows`).
    Returns (path, rows) [max_depth + 1] each."""
    t, d = parents.numel(), max_depth
    if not (tokens.numel() == scores.numel() == t) or not 0 < t <= MAX_T:
        raise ValueError(f"accept_sample_round: parents, tokens, scores must be [T] with 0 < T <= {MAX_T}")
    if probs.dim() != 2 or probs.shape[0] < t or probs.dtype != torch.float32 or probs.stride(1) != 1:
        raise ValueError("accept_sample_round: probs must be fp32 [>= T, V] with a contiguous last dimension")
    if coins.dim() != 2 or coins.shape[0] < t or coins.shape[1] != top_k + 1 or coins.stride(1) != 1:
        raise ValueError(f"accept_sample_round: coins must be [>= T, {top_k + 1}] with a contiguous last dimension")
    for name, x, n in (("length", length, 1), ("nxt", nxt, d + 1), ("bonus", bonus, 1)):
        if x.dtype != torch.long or x.numel() != n or (n > 1 and x.stride(0) != 1):
            raise ValueError(f"accept_sample_round: {name} must be a contiguous int64 [{n}]")
    dev, v = parents.device, probs.shape[1]
    pk = pdl_args(dev)
    bt = max(16, triton.next_power_of_2(t))
    if total is None:
        total = torch.empty(t, dtype=torch.float64, device=dev)
        row_mass_fwd_kernel[(t,)](probs, total, v, probs.stride(0), BV=ROW_MASS_TILE, **pk, num_warps=8)
    elif total.dtype != torch.float64 or total.numel() < t or total.stride(0) != 1:
        raise ValueError(f"accept_sample_round: total must be a contiguous fp64 [>= {t}]")
    path = torch.empty(d + 1, dtype=torch.long, device=dev)
    rows = torch.empty(d + 1, dtype=torch.long, device=dev)
    stop = torch.empty(2, dtype=torch.long, device=dev)   # the stop node, then its bonus coin's bits
    accept_sample_fwd_kernel[(1,)](parents.contiguous(), tokens.contiguous(), scores.contiguous(), probs, total,
                                   coins, path, length, rows, nxt, stop, probs.stride(0), coins.stride(0), T=t,
                                   BT=bt, D=d, BD=max(16, triton.next_power_of_2(d + 1)), K=top_k,
                                   BK=max(2, triton.next_power_of_2(top_k + 1)), **pk, num_warps=1)
    _inverse_cdf(probs, stop, stop, length, bonus, nxt, True)
    return path, rows


def _inverse_cdf(probs, stop, coin, length, bonus, nxt, from_stop: bool) -> None:
    # the bonus's two launches (chunk masses, then the chunk and a scan of it): from_stop, the walk's stop
    # node with its coin (stop) into nxt[length - 1]; else row 0 with `coin` into nxt[0] (`sample_row`)
    v, dev = probs.shape[1], probs.device
    pk = pdl_args(dev)
    nc = triton.cdiv(v, BONUS_CHUNK)
    part = torch.empty(nc, dtype=torch.float64, device=dev)
    lastp = torch.empty(nc, dtype=torch.int32, device=dev)
    bonus_mass_fwd_kernel[(nc,)](probs, stop, part, lastp, v, probs.stride(0), BV=BONUS_CHUNK, STOP=from_stop, **pk,
                                 num_warps=4)
    bonus_pick_fwd_kernel[(1,)](probs, stop, coin, part, lastp, length, bonus, nxt, v, nc, probs.stride(0),
                                BV=BONUS_CHUNK, NCP=max(2, triton.next_power_of_2(nc)), STOP=from_stop, **pk,
                                num_warps=4)


def sample_row(probs: torch.Tensor, coin: torch.Tensor, out: torch.Tensor, out2: torch.Tensor) -> torch.Tensor:
    """An AR step's token: `ssv.spec.device_accept.sample_device(probs[0], coin)` (inverse CDF, never a
    zero-probability token) in two launches, the bonus's (chunk masses, then a scan of one chunk), where
    the tensor form is ~9 launches and two copies. probs [1, V] fp32 (unnormalised, >= 0), coin [1] in
    [0, 1); the token is written to out [1] and out2 [1] (int64: the step's record and next input).
    Returns out."""
    if probs.dim() != 2 or probs.shape[0] != 1 or probs.shape[1] == 0 or probs.dtype != torch.float32 \
            or probs.stride(1) != 1:
        raise ValueError(f"sample_row: probs must be fp32 [1, V] with V > 0 and a contiguous row, got "
                         f"{tuple(probs.shape)} {probs.dtype}")
    if coin.numel() != 1 or not coin.is_floating_point():
        raise ValueError("sample_row: coin must be one float")
    for name, x in (("out", out), ("out2", out2)):
        if x.dtype != torch.long or x.numel() != 1 or x.device != probs.device:
            raise ValueError(f"sample_row: {name} must be an int64 [1] on {probs.device}")
    _inverse_cdf(probs, coin, coin, out, out2, out, False)
    return out


def sample_logits_row(logits: torch.Tensor, inv_temperature: torch.Tensor, coin: torch.Tensor, out: torch.Tensor,
                      out2: torch.Tensor) -> torch.Tensor:
    """An AR step's token straight from its logits (a setting without top-p): `sample_device(probs_unchecked(
    logits)[0], coin)` up to rounding, in two launches over 1,024-token chunks (each chunk's max and sum of exp,
    then the pick over the chunks rescaled to the row's max and a scan of one chunk), where `probs_rows` +
    `sample_row` take three, the first a single program's chain over the whole row. logits [1, V] float with a
    contiguous row, inv_temperature [1] (`DeviceSampling`'s), coin [1] in [0, 1); the token is written to out [1]
    and out2 [1] (int64). Never a token whose exp(x - max) is 0 in fp32. Returns out."""
    if logits.dim() != 2 or logits.shape[0] != 1 or logits.shape[1] == 0 or not logits.is_floating_point() \
            or logits.stride(1) != 1:
        raise ValueError(f"sample_logits_row: logits must be a float [1, V] with V > 0 and a contiguous row, got "
                         f"{tuple(logits.shape)} {logits.dtype}")
    dev = logits.device
    for name, x in (("inv_temperature", inv_temperature), ("coin", coin)):
        if not isinstance(x, torch.Tensor) or x.numel() != 1 or not x.is_floating_point() or x.device != dev:
            raise ValueError(f"sample_logits_row: {name} must be one float on {dev}")
    for name, x in (("out", out), ("out2", out2)):
        if x.dtype != torch.long or x.numel() != 1 or x.device != dev:
            raise ValueError(f"sample_logits_row: {name} must be an int64 [1] on {dev}")
    v = logits.shape[1]
    pk = pdl_args(dev)
    nc = triton.cdiv(v, BONUS_CHUNK)
    cmax = torch.empty(nc, dtype=torch.float32, device=dev)
    part = torch.empty(nc, dtype=torch.float64, device=dev)
    logits_mass_fwd_kernel[(nc,)](logits, inv_temperature, cmax, part, v, BV=BONUS_CHUNK, **pk, num_warps=4)
    logits_pick_fwd_kernel[(1,)](logits, inv_temperature, coin, cmax, part, out, out2, v, nc, BV=BONUS_CHUNK,
                                 NCP=max(2, triton.next_power_of_2(nc)), **pk, num_warps=4)
    return out
