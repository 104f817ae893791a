"""Probe: the decode step's four projections (SmolLM2 shape) at 1 and 48 rows, cuBLAS (F.linear /
addmm as the layers call them) against a plain small-M Triton GEMM over a few tile shapes, each as
CUDA-graph replays of 50 calls (us per call). Decides whether a Triton projection path is worth
building; prints a table, JSON to $OUT."""
import json, os, sys, torch, triton
import triton.language as tl
sys.path.insert(0, ".")
from ssv.bench.env import environment


@triton.jit
def mm_probe_kernel(x, w, y, M, N, K, s_xm, s_wn, s_ym, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    i_n, i_m = tl.program_id(0), tl.program_id(1)
    o_m = i_m * BM + tl.arange(0, BM)
    o_n = i_n * BN + tl.arange(0, BN)
    acc = tl.zeros([BM, BN], tl.float32)
    for k0 in range(0, K, BK):
        o_k = k0 + tl.arange(0, BK)
        a = tl.load(x + o_m[:, None] * s_xm + o_k[None, :], mask=(o_m < M)[:, None] & (o_k < K)[None, :], other=0.0)
        b = tl.load(w + o_n[None, :].to(tl.int64) * s_wn + o_k[:, None], mask=(o_n < N)[None, :] & (o_k < K)[:, None],
                    other=0.0)
        acc += tl.dot(a, b)
    tl.store(y + o_m[:, None] * s_ym + o_n[None, :], acc.to(y.dtype.element_ty), mask=(o_m < M)[:, None] & (o_n < N)[None, :])


def graph_us(fn, reps=50):
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            fn()
    g.replay(); torch.cuda.synchronize()
    best = float("inf")
    for _ in range(5):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record(); g.replay(); e1.record(); torch.cuda.synchronize()
        best = min(best, e0.elapsed_time(e1) * 1e3 / reps)
    return best


shapes = {"qkv": (576, 960), "o": (576, 576), "gate_up": (576, 3072), "down": (1536, 576)}
res = {"env": environment(), "rows": []}
for m in (1, 48):
    for name, (k, n) in shapes.items():
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
        y = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        r = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        cub = graph_us(lambda: torch.nn.functional.linear(x, w))
        cub_add = graph_us(lambda: r.addmm_(x, w.t()))
        best = None
        for bn in (16, 32, 64):
            for bk in (64, 128, 256):
                for warps in (2, 4):
                    for stages in (2, 3, 4):
                        bm = max(16, triton.next_power_of_2(m))
                        def run():
                            mm_probe_kernel[(triton.cdiv(n, bn), triton.cdiv(m, bm))](
                                x, w, y, m, n, k, x.stride(0), w.stride(0), y.stride(0), BM=bm, BN=bn, BK=bk,
                                num_warps=warps, num_stages=stages)
                        try:
                            t = graph_us(run)
                        except Exception as e:  # noqa: BLE001 (shared memory and the like)
                            continue
                        if best is None or t < best[0]:
                            best = (t, dict(BN=bn, BK=bk, warps=warps, stages=stages))
        run_err = (y.float() - torch.nn.functional.linear(x, w).float()).abs().max().item()
        row = dict(rows=m, proj=name, K=k, N=n, cublas_us=cub, cublas_addmm_us=cub_add, triton_us=best[0],
                   triton_cfg=best[1], weight_floor_us=n * k * 2 / 4.3e6, max_abs_err=run_err)
        res["rows"].append(row)
        print(f"M={m:3d} {name:8s} cublas {cub:6.2f} addmm {cub_add:6.2f} triton {best[0]:6.2f} {best[1]} "
              f"floor {row['weight_floor_us']:.2f}", flush=True)
out = os.path.join(os.environ.get("OUT", "bench/results"), f"probe-gemm-{res['env']['commit']}.json")
json.dump(res, open(out, "w"), indent=1)
print("wrote", out)
