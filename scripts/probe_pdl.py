"""Programmatic dependent launch, op by op, in one process: the graphed AR step and 48-node verify pass
(random bf16 weights, as `ssv bench e2e --steps`) captured with PDL on for every Triton kernel, off for
all, and off for one op's kernels at a time; the graphs' replays interleaved so clock drift hits every
variant alike. Which ops' boundaries gain, and which lose, at each shape. Writes OUT.json.
usage: python3 scripts/probe_pdl.py OUT.json [--cases smollm2-135m:4096 llama3.1-8b:65536 ...]
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import json

import torch

import ssv.ops.commit.ops as commit
import ssv.ops.glue.ops as glue
import ssv.ops.linear.ops as lin
import ssv.ops.nsa.plan as plan_mod
import ssv.ops.nsa.route as route
import ssv.ops.nsa.verify as verify
from ssv.attention import VerifyOptions
from ssv.attention_device import device_plan
from ssv.bench.e2e_steps import SHAPES, capture_graph, fill_cache, random_model, replay_ms, synthetic_tree
from ssv.bench.env import environment
from ssv.engine.device_round import DeviceEngine
from ssv.engine.runner import Runner

OFF = lambda device: {"PDL": False}   # noqa: E731
# the launch modules whose `pdl_args` a variant replaces (linear reads `pdl_enabled`)
OPS = {"glue": glue, "route": route, "verify": verify, "plan": plan_mod, "commit": commit}


@contextlib.contextmanager
def pdl_off(ops):
    saved = {name: OPS[name].pdl_args for name in ops if name in OPS}
    lin_saved = lin.pdl_enabled
    try:
        for name in saved:
            OPS[name].pdl_args = OFF
        if "linear" in ops:
            lin.pdl_enabled = lambda device: False
        yield
    finally:
        for name, f in saved.items():
            OPS[name].pdl_args = f
        lin.pdl_enabled = lin_saved


VARIANTS = {"on": (), "off": ("glue", "route", "verify", "plan", "commit", "linear"), "off glue": ("glue",),
            "off route": ("route",), "off verify": ("verify",), "off linear": ("linear",), "off plan": ("plan",),
            "off commit": ("commit",)}


@torch.no_grad()
def run_case(shape: str, ctx: int, reps: int) -> list:
    cfg = SHAPES[shape]
    model = random_model(cfg)
    gen = torch.Generator(device="cuda").manual_seed(0)
    depth, mask = synthetic_tree(48, torch.Generator().manual_seed(ctx), "cuda")
    tokens = torch.randint(0, cfg.vocab_size, (48,), device="cuda")
    runner = Runner(model, attention="nsa", max_len=ctx + 256)
    fill_cache(runner, ctx, gen)
    eng = DeviceEngine(runner)
    dlen0 = runner.cache.dlen.clone()
    reset = lambda: runner.cache.dlen.copy_(dlen0)  # noqa: E731
    graphs, keep = {}, []   # keep: the plans whose buffers the graphs read must outlive the capture
    for vname, ops in VARIANTS.items():
        with pdl_off(ops):
            graphs[("ar-nsa", vname)] = capture_graph(eng._ar_body, reset)
            for step, vo in (("ssv strict", VerifyOptions(4)), ("sd-naive", VerifyOptions(1))):
                p = device_plan("nsa", runner.nsa, vo, 48, runner.cache, cfg.n_heads, True)

                def fwd(p=p):
                    pos = runner.cache.dlen.long() + depth
                    p.plan(runner.cache.dlen, pos, mask)
                    model(tokens, pos, p, runner.cache)
                graphs[(step, vname)] = capture_graph(fwd, reset)
                keep.append((p, fwd))
    times = {k: [] for k in graphs}
    for _ in range(reps):
        for k, g in graphs.items():
            times[k].append(replay_ms(g, reset))
    rows = []
    for (step, vname), t in times.items():
        ms = sorted(t)[len(t) // 2]
        rows.append(dict(shape=shape, context=ctx, step=step, variant=vname, ms=ms))
    for step in ("ar-nsa", "ssv strict", "sd-naive"):
        on = next(r["ms"] for r in rows if r["step"] == step and r["variant"] == "on")
        line = "  ".join(f"{r['variant']} {r['ms']:.3f}" for r in rows if r["step"] == step)
        off = next(r["ms"] for r in rows if r["step"] == step and r["variant"] == "off")
        print(f"{shape:13s} {ctx:6d} {step:11s} {line}   off/on {off / on:.3f}", flush=True)
    del graphs, keep, eng, runner, model
    torch.cuda.empty_cache()
    return rows


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--cases", nargs="+", default=["smollm2-135m:4096", "smollm2-135m:8192", "llama3.1-8b:65536"])
    p.add_argument("--reps", type=int, default=30)
    a = p.parse_args()
    doc = {"env": environment(), "date": datetime.datetime.now(datetime.timezone.utc).isoformat(), "rows": []}
    for case in a.cases:
        shape, ctx = case.split(":")
        doc["rows"] += run_case(shape, int(ctx), a.reps)
        with open(a.out, "w") as f:
            json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
