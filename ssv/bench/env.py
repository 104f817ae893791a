"""Where and how the benchmarks time: the run's environment (device, versions, date, commit), CUDA-graph
timing with CUDA events, and the copy bandwidth achieved bandwidth is reported against."""
from __future__ import annotations

import datetime
import math
import os
import platform
import subprocess
import sys

import torch


def commit(cwd=None):
    """SSV_COMMIT (machines without git), else the checkout's HEAD, marked "-dirty" when tracked files
    differ from it: the device machine's copy of the working tree carries a stale .git, whose HEAD
    labelled runs of newer code with an old commit."""
    if os.environ.get("SSV_COMMIT"):
        return os.environ["SSV_COMMIT"]
    here = cwd or os.path.dirname(__file__)
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=here).stdout.strip()
        if not head:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, cwd=here).stdout.strip()
        return head + ("-dirty" if dirty else "")
    except OSError:
        return None


def environment(device: str = "cuda") -> dict:
    """Where a benchmark ran: device, versions, date, commit (the CPU: its core count, no CUDA)."""
    env = {"torch": torch.__version__, "python": platform.python_version(),
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "commit": commit()}
    if device != "cuda":
        # the CPU step's GEMM form per row count (ssv/ops/linear/cpu.py): the forms round differently
        from ssv.ops.linear.cpu import cpu_forms
        return {"device": f"cpu ({os.cpu_count()} cores)", **env, "cpu_gemm": list(cpu_forms())}
    import triton

    from ssv.ops.linear.policy import tiles_measured
    name = torch.cuda.get_device_name(0)
    # None: no tuned small-M linear tiles for this GPU, its decode GEMMs on cuBLAS (sessions 31-39's H100 rows)
    return {"device": name, "triton": triton.__version__, "cuda": torch.version.cuda, **env,
            "linear_tiles": tiles_measured(name)}


def timed(fn, optional: bool, label: str, reps: int = 30):
    """(ms, how) of bench_graph; for an opt-in path that fails, (None, "failed: <error>") and a line on
    stderr instead of an exception, so one failing variant does not stop a matrix."""
    try:
        return bench_graph(fn, reps)
    except Exception as e:
        if not optional:
            raise
        print(f"{label} failed: {type(e).__name__}: {e}", file=sys.stderr)
        return None, f"failed: {type(e).__name__}: {e}"[:500]


def bench_graph(fn, reps: int = 30):
    """Median time (ms) of fn replayed from a CUDA graph, timed with CUDA events."""
    import triton.testing
    try:
        return triton.testing.do_bench_cudagraph(fn, rep=reps, return_mode="median"), "graph"
    except Exception:  # not capturable (host syncs): plain launches, still event-timed
        return triton.testing.do_bench(fn, warmup=10, rep=reps, return_mode="median"), "eager"


def copy_bandwidth() -> float:
    import triton.testing
    x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    ms = triton.testing.do_bench(lambda: y.copy_(x), warmup=10, rep=100, return_mode="median")
    return 2 * x.numel() / ms / 1e9  # TB/s, bytes read + written


def rotation(layer_bytes: int) -> int:
    """Layers of K/V a timing rotates through so that each replay reads from memory, not the 50 MB L2
    (240 MB in all, 1-64 layers). The recorded-trace rows once rotated through 8 layers at every
    context, ~32 MB at the default model's 5K, which the L2 holds, and the synthetic rows' cap of 16
    left 63 MB there (found in session 34's review)."""
    return max(1, min(64, math.ceil(240e6 / layer_bytes)))
