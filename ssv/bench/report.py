"""Markdown tables from benchmark JSON files (the README's numbers come from here)."""
from __future__ import annotations

import json
import sys


def kernel_table(path: str, shape: str, context: int) -> str:
    d = json.load(open(path))
    env = d["env"]
    rows = [r for r in d["rows"] if r["shape"] == shape and r["context"] == context]
    out = [f"{shape}, context {context}, bf16, {env['device']}, torch {env['torch']}, triton {env['triton']}, "
           f"{env['date'][:10]}, commit {env['commit'][:10]}, copy bandwidth {env['copy_tbps']:.2f} TB/s",
           "", "| tree N | method | C | ms | unique MB | TB/s | × naive | × FLA slc | × dense |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["ms"] is None:  # an opt-in path this shape does not support
            continue
        out.append(f"| {r['tree']} | {r['method']} | {r['C'] or ''} | {r['ms']:.4f} | {r['unique_bytes'] / 1e6:.1f} | "
                   f"{r['tbps']:.2f} | {r['x_vs_naive']:.2f} | {r.get('x_vs_fla_slc', float('nan')):.2f} | "
                   f"{r['x_vs_dense']:.2f} |")
    return "\n".join(out)


EXACT = {"ssv exact": "folded", "ssv exact, v5 launch": "combine"}  # the two merges the default picks between


def best_table(path: str, tree: int = 64) -> str:
    """Per shape/context at one tree size: naive at its best, the best exact launch of the default's
    two merges (folded at 0989fd0's rows, the combine kernel's "v5 launch"), best approx, FLA, the faster
    dense row (SDPA, or ssv's dense kernel where the file has it)."""
    d = json.load(open(path))
    rows = [r for r in d["rows"] if r.get("ms") is not None]
    out = ["| shape | context | N | naive ms | best exact ms (C, merge) | × naive | best approx ms (C) | × naive | "
           "FLA slc ms | exact × FLA | dense ms |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    keys = sorted({(r["shape"], r["context"], r["tree"]) for r in rows})
    for shape, ctx, n in keys:
        if n != tree:
            continue
        rs = [r for r in rows if (r["shape"], r["context"], r["tree"]) == (shape, ctx, n)]
        naive = min(r["ms"] for r in rs if r["method"].startswith("naive (C=1)"))  # its best launch
        ex = min((r for r in rs if r["method"] in EXACT), key=lambda r: r["ms"])
        ap = min((r for r in rs if r["method"] == "ssv approx"), key=lambda r: r["ms"])
        fla = [r["ms"] for r in rs if r["method"].startswith("fla parallel_nsa slc")]
        dense = min(r["ms"] for r in rs if r["method"].startswith("dense "))   # SDPA or ssv's dense kernel
        f = f"{fla[0]:.4f}" if fla else "—"
        fx = f"{fla[0] / ex['ms']:.2f}" if fla else "—"
        out.append(f"| {shape} | {ctx} | {n} | {naive:.4f} | {ex['ms']:.4f} ({ex['C']}, {EXACT[ex['method']]}) | "
                   f"{naive / ex['ms']:.2f} | {ap['ms']:.4f} ({ap['C']}) | {naive / ap['ms']:.2f} | {f} | {fx} | "
                   f"{dense:.4f} |")
    return "\n".join(out)


if __name__ == "__main__":
    path = sys.argv[1] if len(sys.argv) > 1 else "bench/results/kernels.json"
    print(best_table(path))
    print()
    print(kernel_table(path, "llama3.1-8b", 65536))
