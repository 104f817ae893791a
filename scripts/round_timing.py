"""Timing for the probe scripts: whole graphed rounds (`probe_round.py`, `probe_draft_vocab_round.py`) in
blocks of N rounds between two syncs, each block's cache length put back, interleaved repeats, and the
GPU-busy fraction of one more block (kernel time over wall time, torch profiler); and one op per call from
a graph of back-to-back calls (`probe_round_ops.py`, `probe_draft_ops.py`)."""
import argparse
import statistics
import time

import torch
from torch.profiler import ProfilerActivity, profile


def op_probe_args() -> argparse.ArgumentParser:
    """The op probes' arguments: OUT.json, --reps (calls a graph), --trials (replays, the median kept)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--trials", type=int, default=15)
    return ap


def graph_us(fn, reps: int, trials: int) -> float:
    """us a call of fn: one CUDA graph of reps back-to-back calls, replayed trials times, the median."""
    from ssv.bench.e2e_steps import capture_graph, replay_ms
    g = capture_graph(lambda: [fn() for _ in range(reps)])
    return sorted(replay_ms(g) for _ in range(trials))[trials // 2] * 1000 / reps


def block(step, runner, n: int, ctx: int) -> float:
    """ms a call of step over n back-to-back calls; the runner's cache is back at ctx after."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        step()
    torch.cuda.synchronize()
    runner.cache.dlen.fill_(ctx)
    runner.cache.length = ctx
    return (time.perf_counter() - t0) * 1e3 / n


def round_rows(steps: dict, n: int, reps: int, ctx: int, warm: int = 2) -> list:
    """steps: name -> (step, runner). warm blocks each (the first captures), then reps blocks each,
    interleaved; rows of the median ms, every block's ms and the busy fraction of one profiled block."""
    for step, r in steps.values():
        for _ in range(warm):
            block(step, r, n, ctx)
    ms = {k: [] for k in steps}
    for _ in range(reps):
        for k, (step, r) in steps.items():
            ms[k].append(block(step, r, n, ctx))
    rows = []
    for k, (step, r) in steps.items():
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            wall = block(step, r, n, ctx)
        busy = sum(e.time_range.end - e.time_range.start for e in prof.events() if e.device_type.name == "CUDA")
        rows.append(dict(mode=k, round_ms=statistics.median(ms[k]), round_ms_all=ms[k],
                         gpu_busy_fraction=busy / 1e3 / n / wall))
    return rows
