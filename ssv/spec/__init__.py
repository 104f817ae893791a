"""Speculative decoding: draft trees (tree.py), their flattened orders and metadata (flatten.py) and lossless acceptance
(accept.py)."""
from ssv.spec.accept import (
    AcceptResult,
    SamplingParams,
    accept_greedy,
    accept_sample,
    coin_shape,
    draw_coins,
    sample_from,
    target_probs,
)
from ssv.spec.flatten import TreeMeta, flatten, tree_metadata
from ssv.spec.tree import ORDERS, DraftTree, TreeSpec, build_tree, chain

__all__ = [
    "AcceptResult",
    "DraftTree",
    "ORDERS",
    "SamplingParams",
    "TreeMeta",
    "TreeSpec",
    "accept_greedy",
    "accept_sample",
    "build_tree",
    "chain",
    "coin_shape",
    "draw_coins",
    "flatten",
    "sample_from",
    "target_probs",
    "tree_metadata",
]
