"""Plain-PyTorch twin of the fused lookup: `context_lookup`, then `attach_chain_device` (what the CPU
round runs; ~290 small ops a round)."""
from __future__ import annotations


def lookup_attach_naive(hist, length, tree, mask, pos, spare, K: int, ngrams: tuple = (2, 4),
                        length_offset: int = 0):
    """`lookup_attach` as tensor ops: the chain of K tokens looked up in hist[:length], attached to
    the tree in the place of its spares (the fixed-shape form, T + K nodes); the text's length is
    length + length_offset. Returns (DeviceTree, mask [T + K, T + K], pos [T + K])."""
    from ssv.spec.lookup import attach_chain_device, context_lookup   # lazily: ssv.spec imports ssv.ops
    if length_offset:
        length = length + length_offset if isinstance(length, int) else length.long() + length_offset
    toks, valid = context_lookup(hist, length, K, ngrams)
    return attach_chain_device(tree, mask, pos, spare, toks, valid)
