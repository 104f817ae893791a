"""Routing's top-n threshold by radix select (`tl.histogram` over 8- or 4-bit digits of the keys' order
bits, 4 or 8 passes, each pass's bins summed from the top) against the bisection `_topk_rows` runs,
each alone on one 2,048-wide row (Llama 64K's padded width, n = 16), compiled for sm_90 here (no GPU):
static SASS instructions, and the bisection loop's body (run ~13-17 times: topn_rounds_cpu.py). Both
kernels are checked against torch on random rows in the interpreter first (TRITON_INTERPRET=1 is set
here for that check; the compile is separate). usage: python3 scripts/topn_radix_sm90.py"""
import os
import subprocess
import sys

import torch
import triton
import triton.language as tl

from sm90 import compile_sm90, sass_lines


@triton.jit
def _order_bits(x):
    b = x.to(tl.int32, bitcast=True)
    return b ^ ((b >> 31) & 0x7FFFFFFF)


@triton.jit
def bisect_kernel(x, out, NBS, NSEL: tl.constexpr, BJ: tl.constexpr):
    # the n-th largest key's order bits, as `_topk_rows` finds it (whole-range start)
    o_j = tl.arange(0, BJ)
    b_ord = _order_bits(tl.load(x + o_j, mask=o_j < NBS, other=float("-inf")))
    lo = tl.full([], -2147483648, tl.int64)
    hi = tl.full([], 2147483648, tl.int64)
    go = 1
    while go > 0:
        mid = (lo + hi) >> 1
        cnt = tl.sum((b_ord >= mid.to(tl.int32)).to(tl.int32), 0)
        ok = cnt >= NSEL
        lo = tl.where(ok, mid, lo)
        hi = tl.where(cnt == NSEL, mid + 1, tl.where(ok, hi, mid))
        go = (hi - lo > 1).to(tl.int32)
    tl.store(out, lo.to(tl.int32))


@triton.jit
def radix_kernel(x, out, NBS, NSEL: tl.constexpr, BJ: tl.constexpr, BITS: tl.constexpr):
    # the n-th largest key's order bits digit by digit from the top: a pass's histogram over the keys
    # that match the prefix so far, the largest digit b with >= need keys at or above it
    o_j = tl.arange(0, BJ)
    b_u = _order_bits(tl.load(x + o_j, mask=o_j < NBS, other=float("-inf"))).to(tl.uint32, bitcast=True) ^ 0x80000000
    NB: tl.constexpr = 1 << BITS
    o_b = tl.arange(0, NB)
    pre = tl.full([], 0, tl.uint32)
    need = tl.full([], NSEL, tl.int32)
    for p in tl.static_range(32 // BITS):
        sh = 32 - BITS * (p + 1)
        dig = ((b_u >> sh) & (NB - 1)).to(tl.int32)
        if p == 0:
            h = tl.histogram(dig, NB)
        else:
            h = tl.histogram(dig, NB, mask=(b_u >> (sh + BITS)) == (pre >> (sh + BITS)))
        ge = tl.sum(h, 0) - tl.cumsum(h, 0) + h                     # [NB] keys with a digit >= b
        b = tl.sum((ge >= need).to(tl.int32), 0) - 1
        need -= tl.sum(tl.where(o_b > b, h, 0), 0)
        pre = pre | (b.to(tl.uint32) << sh)
    tl.store(out, (pre ^ 0x80000000).to(tl.int32, bitcast=True))


def sass(fn, sig, const):
    cc, use = compile_sm90(fn, sig, const)
    return use, sass_lines(cc)


def check():
    # the interpreter in a child process (TRITON_INTERPRET is read at import)
    code = ("import torch, sys; sys.path.insert(0, 'scripts'); import topn_radix_sm90 as M\n"
            "torch.manual_seed(0)\n"
            "for nbs in (1025, 700, 17):\n"
            "    x = torch.rand(2048) ** 3; x[5] = float('inf'); x[nbs - 1] = x[3]\n"
            "    top = torch.topk(x[:nbs], 16).values; keys = [M.order_ref(v) for v in x[:nbs]]\n"
            "    for k, kw in ((M.bisect_kernel, {}), (M.radix_kernel, dict(BITS=8)), (M.radix_kernel, dict(BITS=4))):\n"
            "        o = torch.zeros(1, dtype=torch.int32); k[(1,)](x, o, nbs, NSEL=16, BJ=2048, **kw)\n"
            "        t = int(o)   # bisection: any threshold with exactly n keys at or above; radix: the n-th key\n"
            "        assert sum(c >= t for c in keys) == 16 and (kw == {} or t == M.order_ref(top[-1])), (kw, nbs)\n"
            "print('interpreter: bisection and radix (8, 4 bits) take torch.topk\\'s 16 on 3 rows')\n")
    subprocess.run([sys.executable, "-c", code], check=True, env=dict(os.environ, TRITON_INTERPRET="1"))


def order_ref(v) -> int:
    b = int(torch.tensor([float(v)], dtype=torch.float32).view(torch.int32))
    return b ^ ((b >> 31) & 0x7FFFFFFF)


def main():
    check()
    sig = dict(x="*fp32", out="*i32", NBS="i32")
    use, lines = sass(bisect_kernel, sig, dict(NSEL=16, BJ=2048))
    # the loop: from the first barrier to the backward branch
    i = next(k for k, ln in enumerate(lines) if "BAR.SYNC" in ln)
    j = next(k for k, ln in enumerate(lines) if "BRA" in ln and k > i)
    print(f"bisection: {len(lines)} static instructions (REG/STACK/SHARED {'/'.join(use)}), loop body ~{j - i + 1} a round")
    for bits in (8, 4):
        use, lines = sass(radix_kernel, sig, dict(NSEL=16, BJ=2048, BITS=bits))
        print(f"radix {bits}-bit digits, {32 // bits} passes: {len(lines)} static instructions, all run once "
              f"(REG/STACK/SHARED {'/'.join(use)})")


if __name__ == "__main__":
    main()
