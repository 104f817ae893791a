"""x @ w.T for a CPU decode step's few rows, in the form this machine's BLAS streams fastest.

A decode step multiplies 1-8 fp32 rows by every weight, so it is bound by reading the weights. How
fast MKL reads them at that shape depends on the CPU: on the 2-core AMD EPYC (Zen 4) VM of session
24, MKL 2024.2, a SmolLM2-135M step's layer weights (425 MB; 120 GEMMs with q|k|v and gate|up
concatenated) took 33.4 ms at one row (sgemv, ~13 GB/s) and 62.4 ms at three rows as `F.linear`
(x @ w.T), but 15.0 ms (one row padded to two) and 20.6 ms (three) as (w @ x.T).T, an sgemm whose
small side is its N (bench/results/cpu-gemm/gemm-forms-c05e736.json). A single row is
padded to two so that it takes that sgemm, not the sgemv. On the Intel VM of an earlier session the
transposed form was the slower one. So nothing is assumed: `cpu_forms()` times both forms once per
process over weights larger than the last-level cache and keeps the transposed one only where it is
clearly faster (`MARGIN`); `SSV_CPU_GEMM=linear|transposed` fixes the choice.

Both forms are fp32 GEMMs with fp32 accumulation: they differ in summation order only.
"""
from __future__ import annotations

import functools
import os
import statistics
import time
from typing import Optional

import torch
from torch.nn import functional as F

FORMS = ("linear", "transposed")
MAX_ROWS = 8        # an AR step and a small tree's verify pass; longer steps (prefill) are GEMM-shaped
MARGIN = 1.1        # the transposed form must be this much faster to be chosen (a noisy 2-core VM)
# the row counts timed, each standing for a range: one row (the AR step, padded to two), 2-3, 4 (where
# MKL's F.linear changed kernels on an Intel VM, which decides the CPU's tree), 5-8
PROBES = ((1, (1,)), (3, (2, 3)), (4, (4,)), (6, (5, 6, 7, 8)))
ENV = "SSV_CPU_GEMM"


def cpu_linear(x: torch.Tensor, w: torch.Tensor, b: Optional[torch.Tensor] = None,
               form: str = "linear") -> torch.Tensor:
    """x [..., K] @ w.T (+ b) with w [N, K], as F.linear ("linear") or as (w @ x.T).T with a single
    row padded to two ("transposed"). Returns a contiguous [..., N]."""
    if form == "linear":
        return F.linear(x, w, b)
    if form != "transposed":
        raise ValueError(f"cpu_linear: form must be one of {FORMS}, got {form!r}")
    if x.shape[-1] != w.shape[-1] or w.dim() != 2:
        raise ValueError(f"cpu_linear: x [..., K] and w [N, K] needed, got {tuple(x.shape)} and {tuple(w.shape)}")
    x2 = x.reshape(-1, x.shape[-1])
    m = x2.shape[0]
    y = torch.mm(w, (torch.cat([x2, x2]) if m == 1 else x2).t())   # [N, m or 2]: an sgemm, not MKL's sgemv
    y = y.t()[:m].contiguous()                                    # [m, N]
    if b is not None:
        y += b
    return y if x.dim() == 2 else y.view(*x.shape[:-1], w.shape[0])


def _time(fn, reps: int) -> float:
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def _calibrate(threads: int, n: int = 1536, k: int = 576, mats: int = 12, reps: int = 5) -> tuple:
    # (threads: the cache key of `_calibrated`; the timing runs on torch's current thread count)
    # `mats` distinct weights (42 MB: past a 32 MB L3) so that each GEMM reads its weights from
    # memory, as a step does
    ws = [torch.full((n, k), 0.01 * (i + 1)) for i in range(mats)]
    out = {}
    for m, rows in PROBES:
        x = torch.full((m, k), 0.5)
        t = {f: _time(lambda f=f: [cpu_linear(x, w, form=f) for w in ws], reps) for f in FORMS}
        for r in rows:
            out[r] = _choose(t["linear"], t["transposed"])
    return tuple(out[r] for r in range(1, MAX_ROWS + 1))


def _choose(t_linear: float, t_transposed: float) -> str:
    return "transposed" if t_transposed * MARGIN < t_linear else "linear"


@functools.lru_cache(maxsize=None)
def _calibrated(threads: int) -> tuple:
    with torch.no_grad():
        return _calibrate(threads)


def cpu_forms() -> tuple:
    """The form per row count 1..MAX_ROWS on this machine (measured once per process and thread
    count, or `SSV_CPU_GEMM`, which makes runs reproducible: the forms round differently)."""
    env = os.environ.get(ENV) or "auto"
    if env == "auto":
        return _calibrated(torch.get_num_threads())
    if env not in FORMS:
        raise ValueError(f"{ENV} must be one of {FORMS + ('auto',)}, got {env!r}")
    return (env,) * MAX_ROWS


def uses_forms(device, dtype) -> bool:
    """Whether a model on `device` in `dtype` runs its decode GEMMs through these forms (CPU, fp32)."""
    return torch.device(device).type == "cpu" and dtype == torch.float32


def cpu_form(rows: int) -> str:
    return cpu_forms()[rows - 1] if 1 <= rows <= MAX_ROWS else "linear"
