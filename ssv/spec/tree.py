"""Draft trees for EAGLE-style speculative decoding.

A draft tree has N nodes. Node 0 is the ROOT: the last token already chosen whose KV is not yet
in the cache (EAGLE convention); nodes 1..N-1 are draft tokens. The node at depth k sits at
sequence position ``prefix_len + k``, where ``prefix_len`` is the number of committed tokens in
the KV cache. Node indices are always topological (a parent precedes its children), so a single
forward pass over the nodes in index order can fill depths, ancestor paths and masks.

Everything here is pure PyTorch plus Python lists and runs on CPU; trees are small (<= 256 nodes).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, List, Sequence, Tuple, Union

import torch

__all__ = [
    "DraftTree",
    "TreeSpec",
    "ORDERS",
    "build_tree",
    "chain",
]

ORDERS = ("bfs", "dfs", "pos")

# Per-level log-probs a little above 0 can only come from rounding in the caller's log-softmax;
# anything larger means the caller passed logits instead of log-probabilities.
_LOGPROB_SLACK = 1e-3


def _is_int(x) -> bool:
    # bool is an int subclass; a flag passed by mistake must not read as a count of 0 or 1.
    return isinstance(x, int) and not isinstance(x, bool)


@dataclass(frozen=True, eq=False)
class DraftTree:
    """A draft tree in topological order (see module docstring).

    tokens:  LongTensor[N], token id per node (>= 0); tokens[0] is the root token.
    parents: LongTensor[N], parent index per node; -1 for the root (node 0) only, and
             parents[i] < i for every other node.
    scores:  FloatTensor[N], cumulative draft log-probability; 0.0 for the root by convention.

    Duplicate sibling tokens are allowed (acceptance handles them); NaN scores are not, because
    sibling ordering is defined by score.
    """

    tokens: torch.Tensor
    parents: torch.Tensor
    scores: torch.Tensor
    # Derived once here because every consumer needs them and they are cheap for N <= 256.
    _depth: torch.Tensor = field(init=False, repr=False)
    _children: Tuple[Tuple[int, ...], ...] = field(init=False, repr=False)
    _ranked: Tuple[Tuple[int, ...], ...] = field(init=False, repr=False)

    def __post_init__(self):
        for name in ("tokens", "parents", "scores"):
            t = getattr(self, name)
            if not isinstance(t, torch.Tensor):
                raise ValueError(f"DraftTree.{name} must be a torch.Tensor, got {type(t).__name__}")
            if t.dim() != 1:
                raise ValueError(f"DraftTree.{name} must be 1-D, got shape {tuple(t.shape)}")
        n = self.tokens.shape[0]
        if self.parents.shape[0] != n or self.scores.shape[0] != n:
            raise ValueError(
                "DraftTree.tokens, parents and scores must have the same length, got "
                f"{n}, {self.parents.shape[0]}, {self.scores.shape[0]}"
            )
        if n < 1:
            raise ValueError("DraftTree needs at least one node (the root)")
        if self.tokens.dtype.is_floating_point or self.tokens.dtype == torch.bool:
            raise ValueError(f"DraftTree.tokens must be an integer tensor, got {self.tokens.dtype}")
        if self.parents.dtype.is_floating_point or self.parents.dtype == torch.bool:
            raise ValueError(f"DraftTree.parents must be an integer tensor, got {self.parents.dtype}")
        if not self.scores.dtype.is_floating_point:
            raise ValueError(f"DraftTree.scores must be a floating tensor, got {self.scores.dtype}")

        parents = self.parents.tolist()
        if parents[0] != -1:
            raise ValueError(f"DraftTree: node 0 is the root and must have parent -1, got {parents[0]}")
        for i in range(1, n):
            if not 0 <= parents[i] < i:
                raise ValueError(
                    f"DraftTree: parent of node {i} must be in [0, {i - 1}] (parents precede "
                    f"children, only the root has parent -1), got {parents[i]}"
                )
        if bool((self.tokens < 0).any()):
            raise ValueError("DraftTree.tokens must be >= 0")
        if bool(torch.isnan(self.scores).any()):
            raise ValueError("DraftTree.scores must not contain NaN")

        depth = [0] * n
        children: List[List[int]] = [[] for _ in range(n)]
        for i in range(1, n):
            depth[i] = depth[parents[i]] + 1
            children[parents[i]].append(i)
        object.__setattr__(self, "_depth", torch.tensor(depth, dtype=torch.long, device=self.tokens.device))
        scores = self.scores.tolist()
        object.__setattr__(self, "_children", tuple(tuple(c) for c in children))
        object.__setattr__(
            self, "_ranked", tuple(tuple(sorted(c, key=lambda k: (-scores[k], k))) for c in children)
        )

    @property
    def n(self) -> int:
        return self.tokens.shape[0]

    @property
    def depth(self) -> torch.Tensor:
        """LongTensor[N]: root 0, child = parent + 1."""
        return self._depth

    def children(self, i: int) -> List[int]:
        """Children of node ``i`` in index order."""
        if not 0 <= i < self.n:
            raise ValueError(f"DraftTree.children: node index must be in [0, {self.n - 1}], got {i}")
        return list(self._children[i])

    @property
    def max_children(self) -> int:
        """Largest number of children of any node (0 for a root-only tree)."""
        return max(len(c) for c in self._children)

    @property
    def is_chain(self) -> bool:
        # With topological indices, "no node has two children" forces parents == [-1, 0, 1, ...].
        return all(len(c) <= 1 for c in self._children)

    def sorted_children(self, i: int) -> List[int]:
        """Children of ``i`` in descending draft score, ties broken by lower index.

        This is THE sibling order used by flattening and by acceptance.
        """
        if not 0 <= i < self.n:
            raise ValueError(f"DraftTree.sorted_children: node index must be in [0, {self.n - 1}], got {i}")
        return list(self._ranked[i])


def chain(tokens: Union[torch.Tensor, Sequence[int]]) -> DraftTree:
    """A chain tree (top-k = 1): tokens[0] is the root, tokens[i] the child of tokens[i-1]."""
    tokens = torch.as_tensor(tokens, dtype=torch.long)
    if tokens.dim() != 1 or tokens.shape[0] < 1:
        raise ValueError(f"chain: tokens must be a non-empty 1-D sequence, got shape {tuple(tokens.shape)}")
    n = tokens.shape[0]
    return DraftTree(
        tokens=tokens,
        parents=torch.arange(-1, n - 1, dtype=torch.long, device=tokens.device),
        scores=torch.zeros(n, dtype=torch.float32, device=tokens.device),
    )


# --------------------------------------------------------------------------------------------
# Dynamic tree construction (EAGLE-2 / EAGLE-3)
# --------------------------------------------------------------------------------------------

_SPEC_LIMITS = {"depth": (1, 32), "top_k": (1, 16), "total_tokens": (1, 256)}


@dataclass(frozen=True)
class TreeSpec:
    """Shape of a dynamic draft tree.

    depth:        number of draft levels (expansion rounds), 1..32.
    top_k:        beam width and per-node branching of the expansion, 1..16.
    total_tokens: nodes kept after the final rerank, root included, 1..256 (1 = root only).
    """

    depth: int
    top_k: int
    total_tokens: int

    def __post_init__(self):
        for name, (lo, hi) in _SPEC_LIMITS.items():
            value = getattr(self, name)
            if not _is_int(value) or not lo <= value <= hi:
                raise ValueError(f"TreeSpec.{name} must be an int in [{lo}, {hi}], got {value!r}")

    @property
    def max_nodes(self) -> int:
        """Nodes in the candidate pool, root included: 1 + k + (depth - 1) * k^2."""
        return 1 + self.top_k + (self.depth - 1) * self.top_k * self.top_k


ExpandFn = Callable[[List[int], DraftTree], torch.Tensor]


def _pool_tree(tokens: List[int], parents: List[int], scores: List[float]) -> DraftTree:
    return DraftTree(
        tokens=torch.tensor(tokens, dtype=torch.long),
        parents=torch.tensor(parents, dtype=torch.long),
        scores=torch.tensor(scores, dtype=torch.float32),
    )


def _checked_logprobs(out, n_rows: int, top_k: int) -> torch.Tensor:
    if not isinstance(out, torch.Tensor) or out.dim() != 2 or out.shape[0] != n_rows:
        shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ValueError(f"build_tree: expand must return a Tensor[{n_rows}, V], got {shape}")
    if out.shape[1] < top_k:
        raise ValueError(f"build_tree: top_k={top_k} exceeds the vocabulary size {out.shape[1]}")
    lp = out.detach().to(device="cpu", dtype=torch.float64)
    if bool(torch.isnan(lp).any()):
        raise ValueError("build_tree: expand returned NaN log-probabilities")
    if bool((lp > _LOGPROB_SLACK).any()):
        raise ValueError("build_tree: expand must return log-probabilities (<= 0), got positive values")
    # Clamp rounding noise so scores never increase along a path (the rerank relies on it).
    return lp.clamp_max(0.0)


def top_k_stable(x: torch.Tensor, k: int) -> tuple:
    """The first k entries of a stable descending sort of x [..., V] along its last dim (ties: the lower
    index first), by one top-k of an int64 key that orders by the float32 value, then by the lower
    index: no sort of the row (a full sort of the 49152-token vocabulary was a third of a CPU draft).
    Values in x's dtype, int64 indices. The device round's vocabulary top-k uses it too."""
    v = x.shape[-1]
    bits = x.float().view(torch.int32)
    key32 = torch.where(bits >= 0, bits, bits ^ 0x7FFFFFFF).long()      # order-preserving
    idx = torch.arange(v, device=x.device)
    top = torch.topk((key32 << 32) | (v - 1 - idx), k, dim=-1).values
    t = (v - 1) - (top & 0xFFFFFFFF)
    return x.gather(-1, t), t


def build_tree(
    expand: ExpandFn,
    root_token: int,
    depth: int,
    top_k: int,
    total_tokens: int,
) -> DraftTree:
    """Grow a draft tree the way EAGLE-2/EAGLE-3 do; returns it in creation order.

    ``expand(frontier, tree_so_far)`` returns draft log-probabilities ``Tensor[len(frontier), V]``
    of the next token after each frontier node; ``tree_so_far`` is the candidate pool built so
    far (a DraftTree whose indices the frontier refers to), so the drafter can read paths,
    depths and positions from it.

    Level 1 expands the root. At every level each frontier node proposes its top_k tokens
    (cumulative score = parent score + log-prob); ALL of those candidates join the pool, and the
    top_k of them by score become the next frontier. After ``depth`` levels, the
    ``total_tokens - 1`` best pool nodes are kept. Ties are broken by pool (creation) index, so a
    parent beats an equal-scored child and the kept set is closed under ancestors.

    The result is re-indexed in creation order, which is topological; use ``flatten`` for a
    specific layout.
    """
    spec = TreeSpec(depth=depth, top_k=top_k, total_tokens=total_tokens)
    if not _is_int(root_token) or root_token < 0:
        raise ValueError(f"build_tree: root_token must be an int >= 0, got {root_token!r}")

    tokens, parents, scores = [root_token], [-1], [0.0]
    if spec.total_tokens == 1:
        return _pool_tree(tokens, parents, scores)

    frontier = [0]
    for _ in range(spec.depth):
        logprobs = _checked_logprobs(
            expand(list(frontier), _pool_tree(tokens, parents, scores)), len(frontier), spec.top_k
        )
        # equal log-probs are proposed lowest token id first
        top_lp, top_tok = top_k_stable(logprobs, spec.top_k)
        level = []
        for row, u in enumerate(frontier):
            for j in range(spec.top_k):
                tokens.append(int(top_tok[row, j]))
                parents.append(u)
                scores.append(scores[u] + float(top_lp[row, j]))
                level.append(len(tokens) - 1)
        frontier = sorted(level, key=lambda i: (-scores[i], i))[: spec.top_k]

    kept = sorted(range(1, len(tokens)), key=lambda i: (-scores[i], i))[: spec.total_tokens - 1]
    kept = [0] + sorted(kept)  # creation order is topological
    new_index = {old: new for new, old in enumerate(kept)}
    for old in kept[1:]:
        if parents[old] not in new_index:
            raise AssertionError(
                f"build_tree: kept node {old} lost its parent {parents[old]}; "
                "scores must not increase along a path"
            )
    return _pool_tree(
        [tokens[i] for i in kept],
        [-1] + [new_index[parents[i]] for i in kept[1:]],
        [scores[i] for i in kept],
    )
