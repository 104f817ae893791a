"""A stand-alone attempt at session 38's one-warp miscompile (routing's top-n tail at one warp: a
multi-row `tl.cumsum` feeding an indexed store came out one low on a row, H100, Triton 3.6): rows of a
[QC, BT] boolean tile compacted to their selected columns by the scan's ranks, against torch. Without
a GPU it prints the TTGIR layout of the scan (the failing launch's was threadsPerWarp [8, 4], order
[0, 1]); on a GPU it also runs 2,000 random tiles a warps setting and counts wrong rows.
    python scripts/repro_scan_one_warp.py
"""
import os
import re
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


@triton.jit
def compact_rows_fwd_kernel(x, out, cnt, s_xn, s_on, QC: tl.constexpr, BT: tl.constexpr, BASE: tl.constexpr):
    o_q = tl.arange(0, QC)
    o_t = tl.arange(0, BT)
    b_sel = tl.load(x + o_q[:, None] * s_xn + o_t[None, :]) > 0                   # [QC, BT]
    b_base = tl.load(cnt + o_q)                                                    # [QC] a row's offset
    rank = tl.cumsum(b_sel.to(tl.int32), 1) - 1 + b_base[:, None]
    tl.store(out + o_q[:, None] * s_on + rank, BASE + o_t[None, :] + tl.zeros_like(rank), mask=b_sel)


def reference(x, base, off):
    out = torch.full((x.shape[0], x.shape[1] + off), -1, dtype=torch.int32)
    for i in range(x.shape[0]):
        cols = (x[i] > 0).nonzero().flatten()
        out[i, base[i]:base[i] + cols.numel()] = (cols + off).int()
    return out


def main():
    QC, BT, OFF = 8, 16, 64
    if not torch.cuda.is_available():
        os.environ.pop("TRITON_INTERPRET", None)
        from sm90 import compile_sm90
        sig = dict(x="*i32", out="*i32", cnt="*i32", s_xn="i32", s_on="i32")
        for warps in (1, 2, 4):
            cc, _ = compile_sm90(compact_rows_fwd_kernel, sig, dict(QC=QC, BT=BT, BASE=OFF), warps)
            ttgir = cc.asm["ttgir"]
            lays = dict(re.findall(r"^#(\w+) = (#ttg\.blocked<\{.*?\}>)", ttgir, re.M))
            for lay in re.findall(r'"tt.scan".*?\) : \(tensor<\w+, #(\w+)>\)', ttgir, re.S):
                print(f"{warps} warps: scan in {lays.get(lay, lay)}")
        return
    gen = torch.Generator().manual_seed(0)
    for warps in (1, 2, 4):
        bad = 0
        for _ in range(2000):
            x = (torch.rand(QC, BT, generator=gen) < 0.2).int()
            base = torch.randint(0, 4, (QC,), generator=gen).int()
            out = torch.full((QC, BT + OFF), -1, dtype=torch.int32, device="cuda")
            compact_rows_fwd_kernel[(1,)](x.cuda(), out, base.cuda(), BT, BT + OFF, QC=QC, BT=BT, BASE=OFF,
                                          num_warps=warps)
            want = reference(x, base.tolist(), OFF)
            bad += int((out.cpu()[:, :BT + OFF] != want).any(1).sum())
        print(f"{warps} warps: {bad} wrong rows of {2000 * QC}")


if __name__ == "__main__":
    main()
