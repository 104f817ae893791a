from ssv.ops.dense.naive import dense_naive

__all__ = ["dense_naive"]
