from ssv.ops.dense.naive import dense_naive
from ssv.ops.dense.ops import dense_verify

__all__ = ["dense_naive", "dense_verify"]
