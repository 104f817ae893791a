"""A draft tree flattened for one verification pass: the node orders (BFS, DFS, position-sorted), and the
positions, ancestor mask and paths the target's forward over the flattened nodes needs."""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Tuple

import torch

from ssv.spec.tree import ORDERS, DraftTree, _is_int


def _preorder(tree: DraftTree) -> List[int]:
    out: List[int] = []
    stack = [0]
    while stack:
        u = stack.pop()
        out.append(u)
        # Reversed so the best-scored sibling is popped (visited) first.
        stack.extend(reversed(tree.sorted_children(u)))
    return out


def _levelorder(tree: DraftTree) -> List[int]:
    out = [0]
    for u in out:  # `out` grows while iterated: it is the BFS queue.
        out.extend(tree.sorted_children(u))
    return out


def _posorder(tree: DraftTree) -> List[int]:
    preorder_index = {u: k for k, u in enumerate(_preorder(tree))}
    depth = tree.depth.tolist()
    parents = tree.parents.tolist()
    by_level: List[List[int]] = [[] for _ in range(max(depth) + 1)]
    for u in range(tree.n):
        by_level[depth[u]].append(u)
    out: List[int] = []
    for level in by_level:
        parents_here = sorted({parents[u] for u in level}, key=lambda p: preorder_index.get(p, -1))
        for p in parents_here:
            out.extend([0] if p == -1 else tree.sorted_children(p))
    return out


def flatten(tree: DraftTree, order: str) -> Tuple[DraftTree, torch.Tensor]:
    """Reorder the nodes of ``tree``; returns ``(new_tree, perm)`` with ``perm[new] = old``.

    In every order siblings are visited in descending draft score (ties: lower old index
    first), the root stays at index 0 and parents precede children.

    - ``"bfs"``: level order. Depth is non-decreasing; within a level the nodes are grouped by
      parent, groups in the order their parents appear in this BFS order.
    - ``"dfs"``: preorder. Every subtree occupies a contiguous index range starting at its root.
    - ``"pos"``: sorted by position (= depth), siblings adjacent; the sibling groups of one level
      are ordered by their parent's DFS preorder index.

    Note: restricted to one level, both BFS order and DFS preorder list nodes lexicographically
    by their path of sibling ranks, so "pos" yields the same permutation as "bfs"; it is kept as
    a separate name because it is defined by positions (what a KV layout cares about).
    """
    if order == "bfs":
        perm_list = _levelorder(tree)
    elif order == "dfs":
        perm_list = _preorder(tree)
    elif order == "pos":
        perm_list = _posorder(tree)
    else:
        raise ValueError(f"flatten: order must be one of {ORDERS}, got {order!r}")

    inverse = [0] * tree.n
    for new, old in enumerate(perm_list):
        inverse[old] = new
    old_parents = tree.parents.tolist()
    new_parents = [-1] + [inverse[old_parents[old]] for old in perm_list[1:]]

    device = tree.tokens.device
    perm = torch.tensor(perm_list, dtype=torch.long, device=device)
    new_tree = DraftTree(
        tokens=tree.tokens[perm],
        parents=torch.tensor(new_parents, dtype=tree.parents.dtype, device=tree.parents.device),
        scores=tree.scores[perm],
    )
    return new_tree, perm


@dataclass(frozen=True, eq=False)
class TreeMeta:
    """Everything verification needs to run the tree through the target in one forward pass.

    positions: LongTensor[N], prefix_len + depth (RoPE position and KV slot of each node).
    mask:      BoolTensor[N, N], mask[q, s] is True iff s is q or an ancestor of q.
    ancestors: ancestors[i] is the root-to-i path as node indices (inclusive of both ends).
    depth:     LongTensor[N].
    """

    positions: torch.Tensor
    mask: torch.Tensor
    ancestors: List[List[int]]
    depth: torch.Tensor

    def __post_init__(self):
        n = self.positions.shape[0]
        if self.positions.dim() != 1 or self.depth.shape != (n,):
            raise ValueError("TreeMeta: positions and depth must be 1-D of the same length")
        if self.mask.shape != (n, n) or self.mask.dtype != torch.bool:
            raise ValueError(f"TreeMeta.mask must be a bool tensor of shape ({n}, {n})")
        if len(self.ancestors) != n:
            raise ValueError(f"TreeMeta.ancestors must have {n} entries, got {len(self.ancestors)}")


def tree_metadata(tree: DraftTree, prefix_len: int) -> TreeMeta:
    """Positions, ancestor mask and ancestor paths of ``tree`` placed after ``prefix_len`` tokens."""
    if not _is_int(prefix_len) or prefix_len < 0:
        raise ValueError(f"tree_metadata: prefix_len must be an int >= 0, got {prefix_len!r}")
    parents = tree.parents.tolist()
    ancestors: List[List[int]] = []
    for i in range(tree.n):
        ancestors.append([i] if i == 0 else ancestors[parents[i]] + [i])

    device = tree.tokens.device
    rows = torch.tensor([i for i, path in enumerate(ancestors) for _ in path], dtype=torch.long)
    cols = torch.tensor([s for path in ancestors for s in path], dtype=torch.long)
    mask = torch.zeros(tree.n, tree.n, dtype=torch.bool)
    mask[rows, cols] = True
    return TreeMeta(
        positions=tree.depth + prefix_len,
        mask=mask.to(device),
        ancestors=ancestors,
        depth=tree.depth,
    )
