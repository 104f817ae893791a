"""`ssv bench kernels`: verification attention of a draft tree over a long NSA context.

Side by side, in one run, on identical inputs: the naive per-query kernel (C = 1), SSV exact and
approximate for each C, the routing launches of a refresh layer, flash-linear-attention's
parallel_nsa on a chain of the same length (when installed), and dense attention over the same tree (SDPA, and
ssv's dense kernel `dense_verify`; x_vs_dense is against the faster).
Each row: median time (CUDA graph replays, CUDA events), the unique bytes that must move, achieved
TB/s against the copy bandwidth measured in the same run, and speedups as ratios.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
import zlib
from collections import Counter

import torch

from ssv.bench.env import copy_bandwidth, environment, rotation, timed
from ssv.bench.synthetic import SHAPES, eagle_tree, overlap_of, synthetic_selection, unique_bytes, work_list_bytes
from ssv.config import NSAConfig


def run_case(shape, T, N, cfg, overlap, gen, fla, dtype=torch.bfloat16, split_sweep=(), reps: int = 30):
    from ssv.ops.nsa.naive import num_cmp_blocks
    from ssv.ops.nsa.route import nsa_route, path_block_weights
    from ssv.ops.nsa.verify import nsa_verify, num_counters

    hq, hkv, d = SHAPES[shape]
    dev = "cuda"
    elt = torch.tensor([], dtype=dtype).element_size()
    n_layers = rotation(2 * hkv * (T + N) * d * elt)
    k = torch.randn(n_layers, hkv, T + N, d, device=dev, dtype=dtype)
    v = torch.randn_like(k)
    q = torch.randn(N, hq, d, device=dev, dtype=dtype)
    depth, mask = eagle_tree(N, gen)
    pos = (T + depth).to(dev)
    tmask = mask.to(dev)
    tm8 = tmask.to(torch.uint8)  # the plan's dtypes, prepared once per step (not per layer)
    idx = synthetic_selection(pos.cpu(), hkv, cfg, overlap, gen).to(device=dev, dtype=torch.int32)
    nb = num_cmp_blocks(T, cfg)
    kc = torch.randn(n_layers, hkv, nb, d, device=dev, dtype=dtype)
    vc = torch.randn_like(kc)
    w, s0, npath = path_block_weights(T, pos, tmask, cfg)
    max_pos = int(pos.max())
    out = torch.empty_like(q)
    cnt = torch.zeros(num_counters(N, hq, hkv), device=dev, dtype=torch.int32)  # folded merges' counters, zeroed once
    it = [0]

    def nxt():
        it[0] = (it[0] + 1) % n_layers
        return it[0]

    def verify(C, approx, n_split=None, **kw):
        def f():
            i = nxt()
            nsa_verify(q, k[i], v[i], T, pos, tm8, idx, cfg.slc_block, cfg.window, group_size=C,
                       approx=approx, out=out, n_split=n_split, counters=cnt, **kw)
        return f

    def route():
        i = nxt()
        nsa_route(q, kc[i], vc[i], nb, k[i], v[i], w, s0, npath, pos, cfg, max_pos=max_pos)

    ub = unique_bytes(idx.cpu(), pos.cpu(), T, N, cfg, d, elt)
    rows = []

    def add(method, C, fn, nbytes=ub, optional=False, loads=None):
        ms, how = timed(fn, optional, f"{shape} T={T} N={N} {method} C={C}", reps)
        rows.append(dict(shape=shape, context=T, tree=N, method=method, C=C, ms=ms, timing=how,
                         unique_bytes=nbytes, tbps=None if ms is None else nbytes / ms / 1e9,
                         loaded_bytes=loads, loaded_tbps=None if ms is None or loads is None else loads / ms / 1e9))

    def loads(C, approx=False):  # what the programs read (from L2 or HBM)
        return work_list_bytes(idx.cpu(), pos.cpu(), T, N, cfg, hq, d, elt, C, approx)

    add("naive (C=1)", 1, verify(1, False), loads=loads(1))
    # the baseline at its best: flash-decoding KV splits help the per-query kernel too
    add("naive (C=1), 2 KV splits", 1, verify(1, False, 2), loads=loads(1))
    for C in (2, 4, 8, 16):
        add("ssv exact", C, verify(C, False), loads=loads(C))
    for C in (4, 16):
        add("ssv approx", C, verify(C, True), loads=loads(C, True))
    # v5's default launch (a combine kernel after the KV splits, no folded merge) beside the default
    add("ssv exact, v5 launch", 4, verify(4, False, lazy=True, fold=False), loads=loads(4))
    # the softmax the default does not use: online for exact mode (both sides), lazy for approximate
    add("naive (C=1), online softmax", 1, verify(1, False, lazy=False))
    add("ssv exact, online softmax", 4, verify(4, False, lazy=False), loads=loads(4))
    add("ssv approx, lazy softmax", 16, verify(16, True, lazy=True), optional=True)
    for C, S in split_sweep:
        add(f"ssv exact, {S} KV splits", C, verify(C, False, S))
        if C == 1:
            rows[-1]["method"] = f"naive (C=1), {S} KV splits"
    add("ssv routing", 0, route, nb * hkv * d * elt + N * hq * d * elt)

    # dense attention over the same tree (SDPA; GQA without materialising repeated K/V)
    from torch.nn.functional import scaled_dot_product_attention as sdpa
    vis = torch.cat([torch.ones(N, T, dtype=torch.bool, device=dev), tmask], 1)
    qd = q.transpose(0, 1)[None]

    def dense():
        i = nxt()
        sdpa(qd, k[i][None], v[i][None], attn_mask=vis[None, None], enable_gqa=True)
    add("dense sdpa", 0, dense, 2 * hkv * (T + N) * d * elt)
    # and on ssv's dense kernel (every (query, head) row of a KV head on one tile: the K/V read once)
    from ssv.ops.dense import dense_verify

    def dense_own():
        i = nxt()
        dense_verify(q, k[i], v[i], T, tm8)
    add("dense verify", 0, dense_own, 2 * hkv * (T + N) * d * elt)

    if fla is not None:
        g = hq // hkv
        gpad = max(16, 1 << (g - 1).bit_length())  # FLA needs >= 16 query heads per KV head
        qf = torch.randn(1, N, hkv * gpad, d, device=dev, dtype=dtype)
        kf = k.transpose(1, 2)[:, None]  # [layers, 1, T+N, Hkv, D]
        vf = v.transpose(1, 2)[:, None]
        gc = torch.rand(1, N, hkv * gpad, device=dev, dtype=dtype)
        bi = idx.long()[None]

        def fla_full():
            i = nxt()
            fla(qf, kf[i], vf[i], g_cmp=gc, g_slc=gc, block_counts=cfg.n_select, block_size=cfg.slc_block)

        def fla_slc():
            i = nxt()
            fla(qf, kf[i], vf[i], g_slc=gc, block_indices=bi, block_counts=cfg.n_select, block_size=cfg.slc_block)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            add(f"fla parallel_nsa cmp+slc (G pad {gpad})", 0, fla_full)
            add(f"fla parallel_nsa slc (G pad {gpad})", 0, fla_slc)

    ratios(rows)
    ov = overlap_of(idx.cpu())
    for r in rows:
        r["overlap"] = ov if not r["method"].startswith(("dense", "fla")) else None
    del k, v, kc, vc
    torch.cuda.empty_cache()
    return rows


def ratios(rows):
    """x_vs_naive (against the strongest naive row), x_vs_dense (the fastest dense row) and x_vs_fla_slc of
    one case's rows; failed rows (ms None) get none."""
    base = {(r["method"], r["C"]): r["ms"] for r in rows if r["ms"] is not None}
    naive = min(ms for (m, _), ms in base.items() if m.startswith("naive (C=1)"))
    dense = sorted(ms for (m, _), ms in base.items() if m.startswith("dense "))
    fla = [ms for (m, _), ms in base.items() if m.startswith("fla parallel_nsa slc")]
    for r in rows:
        if r["ms"] is None:
            continue
        r["x_vs_naive"] = naive / r["ms"]
        if dense:
            r["x_vs_dense"] = dense[0] / r["ms"]
        if fla:
            r["x_vs_fla_slc"] = fla[0] / r["ms"]


def cases(contexts, trees, matrix="cross", axis_context=65536, axis_tree=64):
    """(context, tree) pairs to run: every pair ("cross"), or the two axes through (axis_context,
    axis_tree) ("axes": each context at axis_tree, each tree at axis_context); that point first in
    both (if listed), so a run cut short by a time limit has it."""
    first = [(axis_context, axis_tree)] if axis_context in contexts and axis_tree in trees else []
    if matrix == "cross":
        return list(dict.fromkeys(first + [(T, N) for T in contexts for N in trees]))
    if matrix != "axes":
        raise ValueError(f"unknown matrix {matrix!r}: cross or axes")
    out = first + [(T, axis_tree) for T in contexts] + [(axis_context, N) for N in trees]
    return list(dict.fromkeys(out))


def merge_results(paths):
    """One results dict from several `ssv bench kernels` files of the same commit (e.g. one per GPU,
    each a side-by-side run of its own cases): rows concatenated, each file's env kept under runs."""
    docs = []
    for p in paths:
        with open(p) as f:
            docs.append(json.load(f))
    commits = {d["env"].get("commit") for d in docs}
    if len(commits) != 1:
        raise ValueError(f"cannot merge results of different commits: {sorted(map(str, commits))}")
    keys = Counter((r["shape"], r["context"], r["tree"], r["method"], r["C"]) for d in docs for r in d["rows"])
    dup = {k for k, c in keys.items() if c > 1}
    if dup:
        raise ValueError(f"the files time the same rows twice, e.g. {sorted(dup)[0]}")
    env = dict(docs[0]["env"])
    runs = []
    for d in docs:
        e = dict(d["env"])
        runs += e.pop("earlier_runs", []) + [{k: e[k] for k in ("date", "copy_tbps", "device") if k in e}]
    env["runs"] = runs
    return {"env": env, "nsa": docs[0].get("nsa"), "overlap": docs[0].get("overlap"),
            "rows": [r for d in docs for r in d["rows"]]}


def trace_rounds(path: str, max_rounds: int = 3, layers=None):
    """Routing recorded by `ssv generate --record-routing`: overlap by layer over every verification
    step with several queries, and up to `max_rounds` steps' (positions, mask, selections) per layer."""
    rec = torch.load(path, weights_only=False)["records"]
    steps = [r for r in rec if r["positions"].numel() > 1 and r["positions"].numel() <= 128
             and int(r["positions"].min()) >= r["prefix_len"]]
    by_layer = {}
    for r in steps:
        by_layer.setdefault(r["layer"], []).append(overlap_of(r["block_indices"]))
    overlap = {lay: sum(v) / len(v) for lay, v in sorted(by_layer.items())}
    prefixes = sorted({r["prefix_len"] for r in steps})
    chosen = set(prefixes[-max_rounds:])  # the longest contexts
    picks = [r for r in steps if r["prefix_len"] in chosen and (layers is None or r["layer"] in layers)]
    return overlap, picks


TRACE_ROWS = (  # method, C, approx, nsa_verify flags beyond the defaults
    ("naive (C=1)", 1, False, {}), ("ssv exact", 4, False, {}), ("ssv exact", 16, False, {}),
    ("ssv approx", 4, True, {}), ("ssv approx", 16, True, {}),
    ("naive (C=1), online softmax", 1, False, dict(lazy=False)),
    ("ssv exact, online softmax", 4, False, dict(lazy=False)),
    ("ssv exact, v5 launch", 4, False, dict(lazy=True, fold=False)),
)


def run_traces(path, reps: int = 30):
    """Kernel rows on real selections (default model shape): naive vs SSV exact/approx per recorded step."""
    from ssv.ops.nsa.verify import nsa_verify, num_counters
    cfg = NSAConfig()
    hq, hkv, d = SHAPES["smollm2-135m"]
    overlap, picks = trace_rounds(path, layers={0, 10, 20, 29})
    rows = []
    for r in picks:
        T, pos, idx = r["prefix_len"], r["positions"].cuda(), r["block_indices"].cuda().int()
        mask = r["tree_mask"].cuda().to(torch.uint8)
        n = pos.numel()
        n_layers = rotation(2 * hkv * (T + n) * d * 2)
        k = torch.randn(n_layers, hkv, T + n, d, device="cuda", dtype=torch.bfloat16)
        v = torch.randn_like(k)
        q = torch.randn(n, hq, d, device="cuda", dtype=torch.bfloat16)
        it = [0]
        cnt = torch.zeros(num_counters(n, hq, hkv), device="cuda", dtype=torch.int32)

        def verify(C, approx, **kw):
            def f():
                it[0] = (it[0] + 1) % n_layers
                nsa_verify(q, k[it[0]], v[it[0]], T, pos, mask, idx, cfg.slc_block, cfg.window, group_size=C,
                           approx=approx, counters=cnt, **kw)
            return f
        ub = unique_bytes(idx.cpu(), pos.cpu(), T, n, cfg, d, 2)
        ov = overlap_of(r["block_indices"])
        case = []
        for method, C, approx, kw in TRACE_ROWS:
            ms, how = timed(verify(C, approx, **kw), False, f"layer {r['layer']} {method} C={C}", reps)
            case.append(dict(shape="smollm2-135m (real routing)", layer=r["layer"], context=T, tree=n,
                             method=method, C=C, ms=ms, timing=how, unique_bytes=ub,
                             tbps=None if ms is None else ub / ms / 1e9, overlap=ov))
        ratios(case)
        rows += case
    return overlap, rows



def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="ssv bench kernels", description=__doc__)
    add_args(p)
    return cmd_bench_kernels(p.parse_args(argv))


def add_args(p):
    p.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    p.add_argument("--contexts", nargs="+", type=int, default=[8192, 16384, 32768, 65536, 131072])
    p.add_argument("--trees", nargs="+", type=int, default=[4, 16, 64, 128])
    p.add_argument("--matrix", choices=["cross", "axes"], default="cross",
                   help="cross: every (context, tree) pair; axes: each context at 64 tree queries and each "
                        "tree size at 64K context")
    p.add_argument("--merge", nargs="+", metavar="JSON",
                   help="only merge these kernels.json files of one commit into OUT/kernels.json (no GPU)")
    p.add_argument("--claims", metavar="DIR",
                   help="share the matrix with other processes (e.g. one per GPU): a case runs in the process "
                        "that first creates DIR/<case>")
    p.add_argument("--skip-cases-in", nargs="+", default=[], metavar="JSON",
                   help="cases already timed in these kernels.json files (other processes' output) are skipped")
    p.add_argument("--overlap", type=float, default=0.75, help="synthetic adjacent-query overlap")
    p.add_argument("--traces", help="routing recorded by `ssv generate --record-routing` (real selections)")
    p.add_argument("--out", default="bench/results", help="folder for kernels.json and kernels.png")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--split-sweep", action="store_true",
                   help="also time exact C in {1, 4, 16} with 2..16 KV splits forced (tuning the split heuristic)")
    p.add_argument("--traces-only", action="store_true", help="only the real-routing rows (needs --traces)")
    p.add_argument("--reps", type=int, default=30, help="milliseconds of graph replays per timing")
    p.add_argument("--resume", action="store_true",
                   help="keep the rows of OUT/kernels.json made at this commit and run only the missing cases "
                        "(a matrix larger than one 10-minute call, over several calls)")


def cmd_bench_kernels(args) -> int:
    if args.merge:
        merged = merge_results(args.merge)
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "kernels.json"), "w") as f:
            json.dump(merged, f, indent=1)
        print_table(merged["rows"], merged["env"])
        plot(merged["rows"], os.path.join(args.out, "kernels.png"))
        return 0
    if not torch.cuda.is_available():
        raise ValueError("ssv bench kernels needs a CUDA GPU")
    try:
        from fla.ops.nsa import parallel_nsa as fla
    except Exception as e:  # optional [bench] dependency
        print(f"flash-linear-attention not available ({e}); its rows are skipped", file=sys.stderr)
        fla = None
    cfg = NSAConfig()
    env = environment()
    env["copy_tbps"] = copy_bandwidth()
    os.makedirs(args.out, exist_ok=True)
    rows = []
    if args.resume:
        rows, earlier = resumed_rows(os.path.join(args.out, "kernels.json"), env["commit"])
        if earlier:
            env["earlier_runs"] = earlier
    done = {(r["shape"], r["context"], r["tree"]) for r in rows} | cases_in(args.skip_cases_in)
    for shape in ([] if args.traces_only else args.shapes):
        for T, N in cases(args.contexts, args.trees, args.matrix):
            if (shape, T, N) in done or not claim(args.claims, f"{shape}-{T}-{N}"):
                continue
            # one generator per case, so a resumed run draws the same inputs as a whole one
            gen = torch.Generator().manual_seed(zlib.crc32(f"{args.seed}:{shape}:{T}:{N}".encode()))
            sweep = [(C, S) for C in (1, 4, 16) for S in (2, 4, 8, 16)] if args.split_sweep else []
            for r in run_case(shape, T, N, cfg, args.overlap, gen, fla, split_sweep=sweep, reps=args.reps):
                r["frac_of_copy_bw"] = None if r["tbps"] is None else r["tbps"] / env["copy_tbps"]
                rows.append(r)
            print(f"{shape} T={T} N={N} done", file=sys.stderr, flush=True)
            # written after every case so a run stopped at a time limit keeps what it measured
            with open(os.path.join(args.out, "kernels.json"), "w") as f:
                json.dump({"env": env, "nsa": cfg.__dict__, "overlap": args.overlap, "rows": rows}, f, indent=1)
    if rows:
        with open(os.path.join(args.out, "kernels.json"), "w") as f:
            json.dump({"env": env, "nsa": cfg.__dict__, "overlap": args.overlap, "rows": rows}, f, indent=1)
        print_table(rows, env)
        plot(rows, os.path.join(args.out, "kernels.png"))
    if args.traces:
        overlap, trows = run_traces(args.traces, args.reps)
        with open(os.path.join(args.out, "kernels-traces.json"), "w") as f:
            json.dump({"env": env, "overlap_by_layer": overlap, "rows": trows}, f, indent=1)
        print("# real routing: adjacent-query overlap by layer (Jaccard):",
              " ".join(f"{k}:{v:.2f}" for k, v in overlap.items()))
        for r in trows:
            t = "failed" if r["ms"] is None else f"{r['ms']:.4f} ms  x naive {r['x_vs_naive']:.2f}"
            print(f"layer {r['layer']:2d} ctx {r['context']:6d} N {r['tree']:3d} {r['method']:30s} C={r['C']:2d} "
                  f"{t}  overlap {r['overlap']:.2f}")
    return 0


def cases_in(paths) -> set:
    """(shape, context, tree) of the rows in these results files (those that exist)."""
    out = set()
    for p in paths:
        if os.path.exists(p):
            with open(p) as f:
                out |= {(r["shape"], r["context"], r["tree"]) for r in json.load(f)["rows"]}
    return out


def claim(claims, key: str) -> bool:
    """True if this process may run `key`: no claims folder, or it created DIR/key first."""
    if not claims:
        return True
    try:
        os.makedirs(os.path.join(claims, key))
        return True
    except FileExistsError:
        return False


def resumed_rows(path: str, commit: str):
    """(rows, earlier invocations' env) of a file made at the same commit; each row keeps its own
    fraction of the copy bandwidth measured in the invocation that timed it."""
    if not os.path.exists(path):
        return [], []
    with open(path) as f:
        d = json.load(f)
    env = d.get("env", {})
    if env.get("commit") != commit:
        raise ValueError(f"{path} was made at commit {env.get('commit')}, not {commit}: "
                         "--resume only extends a run of the same code")
    earlier = env.pop("earlier_runs", [])
    return d["rows"], earlier + [env]


def print_table(rows, env) -> None:
    print(f"# {env.get('device')}  torch {env.get('torch')}  triton {env.get('triton')}  {env.get('date')}  "
          f"commit {env.get('commit')}  copy {env.get('copy_tbps', float('nan')):.2f} TB/s")
    print(f"{'shape':14s} {'ctx':>6s} {'N':>4s} {'method':38s} {'C':>3s} {'ms':>8s} {'TB/s':>6s} "
          f"{'x naive':>8s} {'x fla':>7s} {'x dense':>8s}")
    nan = float("nan")
    for r in rows:
        if r["ms"] is None:
            print(f"{r['shape']:14s} {r['context']:6d} {r['tree']:4d} {r['method']:38s} {r['C']:3d}   "
                  f"{r['timing'][:68]}")
            continue
        print(f"{r['shape']:14s} {r['context']:6d} {r['tree']:4d} {r['method']:38s} {r['C']:3d} {r['ms']:8.4f} "
              f"{r['tbps']:6.2f} {r['x_vs_naive']:8.2f} {r.get('x_vs_fla_slc', nan):7.2f} "
              f"{r.get('x_vs_dense', nan):8.2f}")


def plot(rows, path) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    shapes = sorted({r["shape"] for r in rows})
    fig, axes = plt.subplots(1, len(shapes), figsize=(6 * len(shapes), 4), squeeze=False)
    for ax, shape in zip(axes[0], shapes):
        n = max(r["tree"] for r in rows if r["shape"] == shape)
        for method, C in sorted({(r["method"], r["C"]) for r in rows if r["shape"] == shape}):
            pts = sorted((r["context"], r["ms"]) for r in rows
                         if r["ms"] is not None and r["shape"] == shape and r["tree"] == n and r["method"] == method and r["C"] == C)
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o",
                        label=f"{method}" + (f" C={C}" if C else ""))
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(f"{shape}, {n} tree queries")
        ax.set_xlabel("context")
        ax.set_ylabel("ms")
        ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
