"""Acceptance of a verified draft tree.

Input: the tree and the target's logits at every node, ``logits[i]`` being the target's
next-token logits after the path root..i. Output: the accepted path (root first), and one bonus
token drawn from the target at the last accepted node. A round therefore emits
``len(path) - 1`` draft tokens plus the bonus.

Greedy (temperature 0): ``accept_greedy`` follows the target's argmax through the tree, which by
construction emits exactly what autoregressive greedy decoding would.

Sampling (temperature > 0): ``accept_sample`` is lossless for DETERMINISTIC draft candidates,
which is what EAGLE's top-k children are (the draft "distribution" over a node's candidates is
a point mass on each). At node u with target distribution p the children are tried in a fixed
order (descending draft score, ties lower index). Child c with token x is accepted with
probability p(x); on rejection x is removed from p (p(x) := 0, renormalise) and the next child
is tried; if all are rejected the bonus is drawn from what is left of p.

Why this samples exactly from p: it is sequential sampling without replacement. Let the
candidates be x1, x2, ... and p_j be p with x1..xj removed and renormalised. Then
P(emit x_j) = prod_{i<j} (1 - p_{i-1}(x_i)) * p_{j-1}(x_j). Since p_{i-1}(x_j) =
p(x_j) / (1 - p(x1) - ... - p(x_{i-1})), the product telescopes to p(x_j). A token y that is not
a candidate is emitted with probability (remaining mass) * p(y) / (remaining mass) = p(y).
Duplicate candidates are harmless: after the first is rejected its token has probability 0.
When a child is accepted, the walk continues at that child, whose logits row is the target's
conditional given the longer prefix, so by induction the whole emitted sequence has the
autoregressive target distribution. This requires the autoregressive sampler to use the very
same ``target_probs`` (temperature, then top-p) as acceptance.

With temperature 0 the target distribution is a point mass and "sampling" is argmax with a
tie rule; ``accept_sample`` refuses it so greedy decoding always goes through the exact
``accept_greedy`` path (ValueError).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Optional

import torch

from ssv.spec.tree import DraftTree

__all__ = [
    "AcceptResult",
    "DeviceSampling",
    "SamplingParams",
    "accept_greedy",
    "accept_sample",
    "coin_shape",
    "draw_coins",
    "sample_from",
    "target_probs",
]


def _is_real(x) -> bool:
    # bool is an int subclass; a flag passed by mistake must not read as 0.0 or 1.0.
    return isinstance(x, (int, float)) and not isinstance(x, bool)


@dataclass(frozen=True)
class SamplingParams:
    """temperature: >= 0 and finite, 0 means greedy. top_p: nucleus mass in (0, 1], 1 = off."""

    temperature: float = 0.0
    top_p: float = 1.0

    def __post_init__(self):
        if not _is_real(self.temperature) or not math.isfinite(self.temperature) or self.temperature < 0:
            raise ValueError(
                f"SamplingParams.temperature must be a finite number >= 0 (0 = greedy), got {self.temperature!r}"
            )
        if not _is_real(self.top_p) or not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"SamplingParams.top_p must be in (0, 1], got {self.top_p!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def inv_temperature(self) -> float:
        """The logits' scale: every path multiplies by it (one rounding to fp32, the same on the host and the
        device, as a Python scalar or as `DeviceSampling`'s buffer)."""
        return 1.0 / self.temperature

    @property
    def filters(self) -> bool:
        """Whether top-p removes anything: top_p == 1 is exactly no filter (and no sort)."""
        return self.top_p < 1.0


class DeviceSampling:
    """SamplingParams as device scalars: 1 / temperature and top_p in a static buffer that a CUDA graph
    reads, so one captured graph serves every temperature and top-p (vLLM keeps its sampling parameters
    in tensors likewise). `filters` stays a Python flag, a graph key: without top-p there is no sort.
    `probs_unchecked` takes it where it takes SamplingParams, with bitwise the same result."""

    greedy = False

    def __init__(self, device, filters: bool = False, _shared: Optional[tuple] = None):
        # the buffer and the host's copy of the values last written into it (no device read), shared with views
        if _shared is None:
            _shared = (torch.ones(2, device=device, dtype=torch.float32), [None])
        self.buf, self._held = _shared
        self.filters = bool(filters)

    @property
    def inv_temperature(self) -> torch.Tensor:
        return self.buf[0:1]

    @property
    def top_p(self) -> torch.Tensor:
        return self.buf[1:2]

    def view(self, params: SamplingParams) -> "DeviceSampling":
        """This buffer with `params`' values written into it (launches only when they change; call it before
        the launches that read them), as the flavour (filters or not) params needs."""
        if params.greedy:
            raise ValueError("DeviceSampling holds a sampled setting; temperature 0 is greedy")
        held = (params.inv_temperature, float(params.top_p))
        if held != self._held[0]:
            self.buf[0].fill_(held[0])
            self.buf[1].fill_(held[1])
            self._held[0] = held
        return DeviceSampling(self.buf.device, params.filters, (self.buf, self._held))


@dataclass(frozen=True)
class AcceptResult:
    """path: accepted node indices, root (0) first. tokens: tokens of path[1:]. bonus: the token
    drawn from the target at path[-1]."""

    path: List[int]
    tokens: List[int]
    bonus: int

    def __post_init__(self):
        if not self.path or self.path[0] != 0:
            raise ValueError(f"AcceptResult.path must start with the root 0, got {self.path}")
        if len(self.tokens) != len(self.path) - 1:
            raise ValueError(
                f"AcceptResult.tokens must have len(path) - 1 = {len(self.path) - 1} entries, got {len(self.tokens)}"
            )
        if self.bonus < 0:
            raise ValueError(f"AcceptResult.bonus must be a token id >= 0, got {self.bonus}")

    @property
    def accepted_len(self) -> int:
        """Tokens emitted this round: len(path) - 1 accepted drafts + 1 bonus = len(path)."""
        return len(self.path)

    @property
    def emitted(self) -> List[int]:
        """Accepted draft tokens followed by the bonus token."""
        return list(self.tokens) + [self.bonus]


def _check_logits(logits: torch.Tensor, where: str) -> None:
    if not isinstance(logits, torch.Tensor) or not logits.dtype.is_floating_point or logits.dim() < 1:
        raise ValueError(f"{where}: logits must be a floating tensor [..., V]")
    if logits.shape[-1] < 1:
        raise ValueError(f"{where}: logits must have a non-empty vocabulary dimension")
    if bool(torch.isnan(logits).any()) or bool((logits == math.inf).any()):
        raise ValueError(f"{where}: logits must not contain NaN or +inf")
    if bool((logits == -math.inf).all(dim=-1).any()):
        raise ValueError(f"{where}: a logits row is entirely -inf (no token is possible)")


def target_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Target sampling distribution over the last dim of ``logits``, fp32.

    Temperature first, then top-p: keep the smallest set of highest-probability tokens whose
    mass is >= top_p (always at least the top token; equal probabilities are ranked by lower
    token id, via a stable sort), then renormalise. Temperature 0 gives the one-hot argmax
    (lowest id on ties). The autoregressive sampler must use this same function, otherwise
    speculative decoding is not distribution-identical to it.
    """
    if not isinstance(params, SamplingParams):
        raise ValueError(f"target_probs: params must be SamplingParams, got {type(params).__name__}")
    _check_logits(logits, "target_probs")
    return probs_unchecked(logits, params)


def probs_unchecked(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """`target_probs` without its input checks, which read the device on the host: the device round's
    (fixed shapes; its logits come from the target, never from a user)."""
    logits = logits.float()
    if params.greedy:
        top = logits.argmax(dim=-1, keepdim=True)  # first maximum = lowest id
        return torch.zeros_like(logits).scatter_(-1, top, 1.0)

    # params: SamplingParams (Python scalars) or DeviceSampling (device scalars, a graph's): the same fp32
    # scale and threshold either way
    probs = torch.softmax(logits * params.inv_temperature, dim=-1)
    # top_p == 1 must be exactly "no filter": float cumsums can reach 1 before the tail does.
    if not params.filters:
        return probs
    sorted_p, order = torch.sort(probs, dim=-1, descending=True, stable=True)
    mass_before = torch.cumsum(sorted_p, dim=-1) - sorted_p
    keep_sorted = mass_before < params.top_p  # position 0 always kept: mass_before == 0
    keep = torch.zeros_like(keep_sorted).scatter_(-1, order, keep_sorted)
    probs = probs * keep
    return probs / probs.sum(dim=-1, keepdim=True)


def sample_from(probs: torch.Tensor, coin: float) -> int:
    """Inverse-CDF sample from a 1-D distribution with a uniform ``coin`` in [0, 1).

    Deterministic given the coin; never returns a zero-probability token. ``probs`` need not be
    exactly normalised (the coin is scaled by the total mass).
    """
    if not isinstance(probs, torch.Tensor) or probs.dim() != 1 or probs.shape[0] < 1:
        raise ValueError("sample_from: probs must be a non-empty 1-D tensor")
    coin = float(coin)
    if not 0.0 <= coin < 1.0:
        raise ValueError(f"sample_from: coin must be in [0, 1), got {coin}")
    p = probs.detach().to(device="cpu", dtype=torch.float64)
    if bool(torch.isnan(p).any()) or bool((p < 0).any()):
        raise ValueError("sample_from: probs must be non-negative and not NaN")
    cdf = torch.cumsum(p, dim=0)
    total = float(cdf[-1])
    if not 0.0 < total < math.inf:
        raise ValueError(f"sample_from: probs must have a finite positive total mass, got {total}")
    # First index whose cdf exceeds the target: a zero-probability token never has a cdf
    # strictly above the previous token's, so it can never be the first to exceed it.
    idx = int(torch.searchsorted(cdf, torch.tensor([coin * total], dtype=torch.float64), right=True))
    last_positive = int(torch.nonzero(p > 0)[-1])
    # Belt and braces: in fp64 with coin < 1, coin * total stays below cdf[-1], but never let a
    # rounding surprise return an index past the last token that has mass.
    return min(idx, last_positive)


def accept_greedy(tree: DraftTree, logits: torch.Tensor) -> AcceptResult:
    """Follow the target's argmax (lowest id on ties) through the tree.

    At node u: if a child of u carries argmax(logits[u]), move to it (with duplicate sibling
    tokens, the child that comes first in descending draft score, ties lower index) and repeat;
    otherwise stop. The bonus is the argmax at the last accepted node.
    """
    _check_tree_logits(tree, logits, "accept_greedy")
    best = logits.argmax(dim=-1).tolist()  # first maximum = lowest id
    tokens = tree.tokens.tolist()
    path = [0]
    while True:
        u = path[-1]
        nxt = next((c for c in tree.sorted_children(u) if tokens[c] == best[u]), None)
        if nxt is None:
            break
        path.append(nxt)
    return AcceptResult(path=path, tokens=[tokens[i] for i in path[1:]], bonus=best[path[-1]])


def coin_shape(tree: DraftTree) -> tuple:
    """Shape of the coins ``accept_sample`` needs: one per child tried plus one for the bonus."""
    return (tree.n, tree.max_children + 1)


def draw_coins(tree: DraftTree, generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """Uniform [0, 1) coins of shape ``coin_shape(tree)``, fp32 on CPU."""
    return torch.rand(coin_shape(tree), generator=generator, dtype=torch.float32)


def accept_sample(
    tree: DraftTree, logits: torch.Tensor, params: SamplingParams, coins: torch.Tensor
) -> AcceptResult:
    """Lossless multi-candidate acceptance for deterministic draft candidates (see module doc).

    ``coins[u, j]`` decides the j-th child of u tried (descending draft score, ties lower index);
    ``coins[u, -1]`` draws the bonus at u if u is the last accepted node.
    """
    if not isinstance(params, SamplingParams):
        raise ValueError(f"accept_sample: params must be SamplingParams, got {type(params).__name__}")
    if params.greedy:
        raise ValueError("accept_sample: temperature 0 is greedy decoding; use accept_greedy")
    _check_tree_logits(tree, logits, "accept_sample")
    want = coin_shape(tree)
    if not isinstance(coins, torch.Tensor) or tuple(coins.shape) != want:
        got = tuple(coins.shape) if isinstance(coins, torch.Tensor) else type(coins).__name__
        raise ValueError(f"accept_sample: coins must have shape {want} (N, max_children + 1), got {got}")
    coin = coins.detach().to(device="cpu", dtype=torch.float64)
    if bool(torch.isnan(coin).any()) or bool((coin < 0).any()) or bool((coin >= 1).any()):
        raise ValueError("accept_sample: coins must be uniforms in [0, 1)")
    coin_rows = coin.tolist()

    # fp64 from here on so the residual renormalisation does not drift.
    probs = target_probs(logits, params).to(device="cpu", dtype=torch.float64)
    tokens = tree.tokens.tolist()
    path = [0]
    while True:
        u = path[-1]
        p = probs[u] / probs[u].sum()
        accepted = None
        for j, c in enumerate(tree.sorted_children(u)):
            x = tokens[c]
            # If x is the only token left, p[x] is exactly 1.0 (a / a) and any coin < 1 accepts,
            # so the residual below can never become all-zero.
            if coin_rows[u][j] < float(p[x]):
                accepted = c
                break
            if p[x] > 0:
                p = p.clone()
                p[x] = 0.0
                p = p / p.sum()
        if accepted is None:
            return AcceptResult(
                path=path, tokens=[tokens[i] for i in path[1:]], bonus=sample_from(p, coin_rows[u][-1])
            )
        path.append(accepted)


def _check_tree_logits(tree: DraftTree, logits: torch.Tensor, where: str) -> None:
    if not isinstance(tree, DraftTree):
        raise ValueError(f"{where}: tree must be a DraftTree, got {type(tree).__name__}")
    _check_logits(logits, where)
    if logits.dim() != 2 or logits.shape[0] != tree.n:
        raise ValueError(f"{where}: logits must have shape [N={tree.n}, V], got {tuple(logits.shape)}")
    if bool((tree.tokens >= logits.shape[1]).any()):
        raise ValueError(f"{where}: tree tokens must be < vocabulary size {logits.shape[1]}")
