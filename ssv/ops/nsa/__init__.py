from ssv.ops.nsa.naive import NSAOutput, compress_mean, nsa_naive, num_cmp_blocks, select_blocks

__all__ = ["NSAOutput", "compress_mean", "nsa_naive", "num_cmp_blocks", "select_blocks"]
