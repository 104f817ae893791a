"""The tree finish of the default 6 x 8 / 48 tree (a 329-node pool grown from random log-probs), launched
eagerly twice at `--warps`, for Nsight Compute (scripts/gpu_s48.sh call e runs it under ncu and
scripts/ncu_stalls.py summarizes its SASS stall samples). Usage: python scripts/ncu_tree_finish.py [--warps 32]"""
import argparse

import torch

from ssv.ops.tree.ops import tree_finish
from ssv.spec.device import grow_pool
from ssv.spec.tree import TreeSpec


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--warps", type=int, default=32)
    a = ap.parse_args()
    dev = torch.device("cuda")
    spec = TreeSpec(6, 8, 48)
    g = torch.Generator().manual_seed(0)
    tab = torch.log_softmax(torch.randn(spec.depth, 64, 8192, generator=g) * 3, -1).double().to(dev)
    pool = grow_pool(lambda lv, t, p, r: tab[lv - 1][t % 64].float(), torch.tensor(5, device=dev),
                     tab[0, 5].float(), spec)
    dlen = torch.tensor([4096], dtype=torch.int32, device=dev)
    for _ in range(2):
        tree_finish(*pool, dlen, spec.total_tokens, spec.top_k, spec.depth, "bfs", num_warps=a.warps)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
