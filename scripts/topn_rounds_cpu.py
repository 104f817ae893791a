"""Rounds of routing's top-n bisection (`_topk_rows`, long rows) from the whole int32 range against
the row's own bracket [max / 64, largest finite key], simulated on the CPU over the importance rows
of a random Llama-shape case (fp32 reference, 16K context, 8 queries, 2 KV heads of 4): both find the
same selection; the bracket's two reductions are counted as rounds. usage: python3 scripts/topn_rounds_cpu.py"""
import numpy as np
import torch

from ssv.config import NSAConfig
from ssv.ops.nsa.naive import nsa_naive


def order(x: np.ndarray) -> np.ndarray:
    b = x.astype(np.float32).view(np.int32).astype(np.int64)
    return b ^ ((b >> 31) & 0x7FFFFFFF)


def bisect(o, lo, hi, nsel):
    rounds = 0
    while hi - lo > 1:
        mid = (lo + hi) >> 1
        c = int((o >= mid).sum())
        rounds += 1
        ok = c >= nsel
        lo, hi = (mid if ok else lo), (mid + 1 if c == nsel else (hi if ok else mid))
    return lo, rounds


def main():
    torch.manual_seed(0)
    cfg = NSAConfig()
    P, N, hkv, G, D = 16384, 8, 2, 4, 128
    q, k = torch.randn(N, hkv * G, D), torch.randn(hkv, P + N, D)
    pos = torch.arange(P, P + N)
    imp = nsa_naive(q, k, torch.randn_like(k), P, pos, torch.ones(N, N, dtype=torch.bool).tril(), cfg).importance
    full, bracket = [], []
    for n in range(N):
        for h in range(hkv):
            row = imp[n, h].numpy()
            cur, j = int(pos[n]) // cfg.slc_block, np.arange(row.size)
            forced = ((j > cur - cfg.forced_local) & (j <= cur)) | ((j == 0) & cfg.forced_first)
            key = np.where(np.isfinite(row) & forced, np.inf, row)
            o = order(key)
            t_full, r_full = bisect(o, -2 ** 31, 2 ** 31, cfg.n_select)
            mx = int(o[np.isfinite(key)].max())
            lo_g = max(mx - 6 * 2 ** 23, 0)
            lo = lo_g if (o >= lo_g).sum() >= cfg.n_select else -2 ** 31
            t_b, r_b = bisect(o, lo, mx + 1, cfg.n_select)
            assert set(np.nonzero(o >= t_full)[0]) == set(np.nonzero(o >= t_b)[0])
            full.append(r_full)
            bracket.append(r_b + 2)
    print(f"rounds over {len(full)} rows: whole range {np.mean(full):.1f} ({min(full)}-{max(full)}), "
          f"bracket + 2 reductions {np.mean(bracket):.1f} ({min(bracket)}-{max(bracket)})")


if __name__ == "__main__":
    main()
