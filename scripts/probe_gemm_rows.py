"""cuBLAS's decode GEMMs of the Llama-3.1-8B shape by row count and form, and a split-K Triton kernel beside them,
bf16, CUDA-graph timed over rotated weight copies (>= 256 MB a timing, past the 50 MB L2): whether a verify pass's
48-row GEMMs can stream the weights as fast as the AR step's one row (the session-51 profile read +392 us a pass).
Run on a GPU from the repository root: python3 scripts/probe_gemm_rows.py OUT.json"""
import json, math, sys, torch
import torch.nn.functional as F
import triton
import triton.language as tl
sys.path.insert(0, ".")
from ssv.bench.env import copy_bandwidth, environment
from ssv.ops.linear.ops import linear as ssv_linear
from ssv.ops.linear.policy import LinearLaunch

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}
SMS = torch.cuda.get_device_properties(0).multi_processor_count


@triton.jit
def splitk_fwd_kernel(x, w, acc_ws, M, N, K: tl.constexpr, SPLIT: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                      BK: tl.constexpr, STAGES: tl.constexpr):
    # weights on the MMA's M (swap AB): [BN, BK] @ [BK, BM] -> [BN, BM]; rows of x padded to BM >= 16
    i_n, i_s = tl.program_id(0), tl.program_id(1)
    o_n = i_n * BN + tl.arange(0, BN)
    o_m = tl.arange(0, BM)
    m_m = o_m < M
    b_acc = tl.zeros([BN, BM], dtype=tl.float32)
    KS: tl.constexpr = K // SPLIT
    for k0 in tl.range(i_s * KS, i_s * KS + KS, BK, num_stages=STAGES):
        o_k = k0 + tl.arange(0, BK)
        b_w = tl.load(w + o_n[:, None].to(tl.int64) * K + o_k[None, :])              # [BN, BK]
        b_x = tl.load(x + o_m[None, :] * K + o_k[:, None], mask=m_m[None, :], other=0.)  # [BK, BM]
        b_acc += tl.dot(b_w, b_x)
    p = acc_ws + o_m[None, :] * N + o_n[:, None]
    if SPLIT == 1:
        tl.store(p, b_acc, mask=m_m[None, :])
    else:
        tl.atomic_add(p, b_acc, mask=m_m[None, :], sem="relaxed")


@triton.jit
def round_zero_kernel(acc_ws, y, n, BLOCK: tl.constexpr):
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = o < n
    tl.store(y + o, tl.load(acc_ws + o, mask=m).to(y.dtype.element_ty), mask=m)
    tl.store(acc_ws + o, tl.zeros([BLOCK], tl.float32), mask=m)


def splitk(x, w, ws, y, split, bn, bk, warps, stages):
    m, k = x.shape
    n = w.shape[0]
    splitk_fwd_kernel[(n // bn, split)](x, w, ws, m, n, K=k, SPLIT=split, BM=max(16, triton.next_power_of_2(m)),
                                        BN=bn, BK=bk, STAGES=stages, num_warps=warps)
    round_zero_kernel[(triton.cdiv(m * n, 4096),)](ws, y, m * n, BLOCK=4096)


def timed(fns):
    """fns: one callable per weight copy; median of 5 replays of a graph over them (x4), us per call."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for fn in fns:
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(4):
            for fn in fns:
                fn()
    out = []
    for _ in range(5):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); g.replay(); b.record(); b.synchronize()
        out.append(a.elapsed_time(b) * 1e3 / (4 * len(fns)))
    return sorted(out)[2]


def splitk_configs(n, k):
    for bn, bk, warps, stages in ((64, 128, 4, 4), (128, 64, 4, 4), (128, 128, 8, 3), (64, 256, 4, 3),
                                  (128, 128, 4, 4), (256, 64, 8, 4)):
        for waves in (1, 2):
            split = 1
            while (n // bn) * split < waves * SMS and k % (split * 2 * bk) == 0:
                split *= 2
            yield bn, bk, warps, stages, split


bw = copy_bandwidth()
rows = []
for name, (n, k) in SHAPES.items():
    nbytes = n * k * 2
    copies = max(2, math.ceil(256e6 / nbytes))
    ws_ = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / 64 for _ in range(copies)]
    floor = nbytes / bw / 1e6   # us: the weights' bytes over the copy bandwidth
    ref = None

    def row(form, m, us, **extra):
        rows.append({"gemm": name, "n": n, "k": k, "rows": m, "form": form, "us": us, "floor_us": floor, **extra})
        print(f"{name:8s} {m:3d} rows {form:40s} {us:8.1f} us  ({us / floor:.2f}x the floor {floor:.1f})", flush=True)

    for m in (1, 16, 32, 48, 64):
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        row("cuBLAS F.linear", m, timed([lambda w=w, x=x: F.linear(x, w) for w in ws_]))
    x48 = torch.randn(48, k, device="cuda", dtype=torch.bfloat16)
    if name in ("o", "down"):   # the step adds these into the residual in place (add_linear's addmm_)
        for m in (1, 48):
            res = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
            row("cuBLAS addmm_ (residual)", m, timed([lambda w=w, a=x48[:m]: res.addmm_(a, w.t()) for w in ws_]))
    x64 = torch.zeros(64, k, device="cuda", dtype=torch.bfloat16)
    x64[:48] = x48
    row("cuBLAS padded to 64", 48, timed([lambda w=w: F.linear(x64, w) for w in ws_]))
    row("cuBLAS 2 x 24", 48, timed([lambda w=w: (F.linear(x48[:24], w), F.linear(x48[24:], w)) for w in ws_]))
    wt = [w.t().contiguous() for w in ws_]   # [K, N]: the NN layout
    row("cuBLAS x @ w_t (NN)", 48, timed([lambda w=w: x48 @ w for w in wt]))
    del wt
    try:
        torch.backends.cuda.preferred_blas_library("cublaslt")
        row("cuBLASLt F.linear", 48, timed([lambda w=w: F.linear(x48, w) for w in ws_]))
        x1 = x48[:1].contiguous()
        row("cuBLASLt F.linear", 1, timed([lambda w=w: F.linear(x1, w) for w in ws_]))
    except Exception as e:   # noqa: BLE001
        print(f"cuBLASLt: {type(e).__name__}: {e}")
    finally:
        torch.backends.cuda.preferred_blas_library("cublas")
    ref = F.linear(x48.float(), ws_[0].float())
    for m, xm in ((48, x48), (1, x48[:1].contiguous())):
        wsp = torch.zeros(m, n, device="cuda", dtype=torch.float32)
        y = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        seen = set()
        for bn, bk, warps, stages, split in splitk_configs(n, k):
            if (bn, bk, warps, stages, split) in seen:
                continue
            seen.add((bn, bk, warps, stages, split))
            try:
                splitk(xm, ws_[0], wsp, y, split, bn, bk, warps, stages)
                err = (y.float() - ref[:m]).abs().max().item()
                us = timed([lambda w=w: splitk(xm, w, wsp, y, split, bn, bk, warps, stages) for w in ws_])
            except Exception as e:   # noqa: BLE001
                print(f"{name} splitk {bn}/{bk}/{warps}/{stages}/{split}: {type(e).__name__}: {str(e)[:120]}")
                continue
            row(f"triton split-K bn{bn} bk{bk} w{warps} s{stages} x{split}", m, us, max_err=err)
        for bn, bk, warps, stages in ((32, 256, 4, 4), (64, 128, 4, 4), (64, 256, 8, 3), (32, 128, 4, 6),
                                      (128, 128, 8, 3)):   # ssv's own linear kernel at wider tiles than its table's
            lp = LinearLaunch(max(16, triton.next_power_of_2(m)), bn, bk, warps, stages)
            try:
                ssv_linear(xm, ws_[0], out=y, launch=lp, pdl=False)
                err = (y.float() - ref[:m]).abs().max().item()
                us = timed([lambda w=w: ssv_linear(xm, w, out=y, launch=lp, pdl=False) for w in ws_])
            except Exception as e:   # noqa: BLE001
                print(f"{name} linear {lp}: {type(e).__name__}: {str(e)[:120]}")
                continue
            row(f"ssv linear bn{bn} bk{bk} w{warps} s{stages}", m, us, max_err=err)
    del ws_
    torch.cuda.empty_cache()
    # after every GEMM: a run cut by its time limit keeps what it measured
    json.dump({"env": environment(), "copy_tbps": bw, "sms": SMS, "rows": rows}, open(sys.argv[1], "w"), indent=1)
