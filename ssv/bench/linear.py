"""`ssv bench linear`: the decode step's GEMMs on the GPU, cuBLAS as the fused layer runs them without
ssv/ops/linear (F.linear / addmm_, and the SwiGLU launch after the gate|up GEMM) against the small-M
Triton kernel at a grid of tiles, and (`--rope`) the q|k|v GEMM + rope_write against `linear_rope`. Each
variant runs as a CUDA graph of one call per layer over distinct weights (so the weights stream from
memory as in a step, not from L2), and each tile's output is checked against the fp32 twin first.
Prints a line per GEMM, writes OUT/probe-linear.json; `--tiles PATH` merges the kernel's best tiles into
that table (the shipped one: ssv/ops/linear/tiles.json) for the GEMMs where they beat the baseline by 3%
or more, `--save` into this machine's table ($SSV_CACHE/linear-tiles.json, which `policy` reads over
the shipped one). With --pdl the kernel is timed as the step launches it on Hopper, with programmatic
dependent launch, and the best tiles once more without it for the record. For M > 1 it also times the
AR step's tiles (16-row programs: each row's product bitwise the AR step's), which --batch-invariant
lists instead of the fastest tiles wherever they are no slower than the baseline.

    ssv bench linear --pdl --batch-invariant --rope --save
"""
from __future__ import annotations

import itertools
import json
import os

import torch
import triton.testing
from torch.nn import functional as F

from ssv.bench.env import environment
from ssv.ops.glue.ops import swiglu
from ssv.ops.linear.naive import linear_naive
from ssv.ops.linear.ops import linear
from ssv.ops.linear.policy import LinearLaunch, default_launch, gemm_key, row_tile, table_entry, user_tiles_path

# (hidden, intermediate, q|k|v width) of one layer
LAYER = {"smollm2-135m": (576, 1536, 960), "llama3.1-8b": (4096, 14336, 6144)}
HEADS = {"smollm2-135m": (9, 3, 64), "llama3.1-8b": (32, 8, 128)}   # (Hq, Hkv, D)
MARGIN = 0.97
DRAFT_ROWS = 8   # a draft level's frontier (the commit's rows, at most the tree's depth + 1, share its row tile)


def gemms(shape):
    """(name, N, K, glu, norm, accumulate); N is the gate's width for glu."""
    h, i, qkv = LAYER[shape]
    return [("qkv", qkv, h, False, True, False), ("o", h, h, False, False, True), ("gate_up", i, h, True, True, False),
            ("down", h, i, False, False, True)]


# (bn, bk, warps, stages) added for GEMMs of >= 8M weights (the Llama-3.1-8B shape's 34-235 MB): a program then
# streams 0.25-1 MB of weights, and what bounds it is the bytes it keeps in flight (bn x bk x stages), which the
# small model's grid (<= 32 x 256 x 8 at one row, 32 x 128 x 6 at more) keeps low
WIDE = ((32, 256, 4, 4), (32, 256, 4, 6), (32, 128, 4, 8), (64, 128, 4, 4), (64, 128, 8, 6), (64, 256, 8, 4),
        (16, 256, 4, 6), (16, 512, 4, 4), (128, 128, 8, 3), (128, 64, 8, 6))


def configs(m: int, quick: bool, n: int = 0, k: int = 0):
    bm = row_tile(m)
    if m == 1:
        grid = itertools.product((16, 32), (64, 128, 256), (3, 4, 6, 8))
    else:
        grid = itertools.product((16, 32), (64, 128), (3, 4, 6))
    out = [LinearLaunch(bm, bn, bk, 4, s) for bn, bk, s in grid]
    if n * k >= 8 << 20:
        out = out[:4] + [LinearLaunch(bm, bn, bk, w, s) for bn, bk, w, s in WIDE if bk <= k]
    return out[:4] if quick else out


def choose(label, key, ar_key, base, base_name, candidates, trial, rows, row, best_out, invariant=None, impl="triton",
           plain=None, dflt=None):
    """Time every candidate tile (trial(lp) -> (matches the fp32 twin, us); an exception: a tile that
    does not compile, recorded and skipped), a row each, and list in best_out[key] the fastest that
    matched where it beats `base` by 1 - MARGIN. With the batch-invariant rule (invariant["_take"], M
    > 1) only the AR step's tiles (invariant[ar_key] at 16-row programs) may be listed, where they are
    no slower than base: never a non-invariant kernel. plain(lp) -> us times the best tiles without
    PDL, for the record. Returns the listed entry or None."""
    ar = None if invariant is None else invariant.get(ar_key)
    inv = None if ar is None else LinearLaunch(16, ar["bn"], ar["bk"], ar["warps"], ar["stages"])
    take_inv = bool(invariant is not None and invariant.get("_take"))
    best = None
    for lp in candidates + ([inv] if inv is not None and inv not in candidates else []):
        try:
            ok, us = trial(lp)
        except Exception as e:
            rows.append(dict(row, impl=impl, config=lp.__dict__, error=str(e)[:200]))
            continue
        rows.append(dict(row, impl=impl, config=lp.__dict__, us=us, matches=ok, default=lp == dflt,
                         batch_invariant=lp == inv))
        if lp == inv:
            print(f"{label} {base_name} {base:7.2f} us  the AR step's tiles {us:7.2f}"
                  + ("" if ok else "  (did not match the fp32 twin)"), flush=True)
            if take_inv and ok and us <= base:
                best_out[key] = table_entry(lp, us, base)
        if ok and (best is None or us < best[1]):
            best = (lp, us)
    if best is None:
        print(f"{label} {base_name} {base:7.2f} us  no tile matched the fp32 twin", flush=True)
        return None
    if plain is not None:   # the same tiles launched plainly, for the record
        us = plain(best[0])
        rows.append(dict(row, impl="triton", config=best[0].__dict__, us=us))
        print(f"{label} best tiles with PDL {best[1]:7.2f} us (without {us:7.2f})", flush=True)
    if take_inv and key not in best_out and inv is not None:
        print(f"{label} the AR step's tiles failed or lost here: left as it was", flush=True)
    if not take_inv and best[1] < MARGIN * base and key not in best_out:
        best_out[key] = table_entry(best[0], best[1], base)
    print(f"{label} {base_name} {base:7.2f} us  best {best[1]:7.2f} (bn {best[0].bn}, bk {best[0].bk}, stages "
          f"{best[0].stages})  {'listed' if key in best_out else 'not listed'}", flush=True)
    return best_out.get(key)


def _bench(fn, layers: int) -> float:
    return triton.testing.do_bench_cudagraph(fn, rep=100, return_mode="median") * 1e3 / layers


def run(shape, m, layers, quick, rows, best_out, invariant=None, pdl=False, dev="cuda"):
    gen = torch.Generator(device=dev).manual_seed(0)
    for name, n, k, glu, norm, acc in gemms(shape):
        ws = [torch.randn(2 * n if glu else n, k, device=dev, generator=gen).mul_(k ** -0.5).bfloat16()
              for _ in range(layers)]
        x = (torch.randn(m, k, device=dev, generator=gen) * 4).bfloat16()
        out = torch.zeros(m, n, device=dev, dtype=torch.bfloat16)
        eps = 1e-5 if norm else None
        want = linear_naive(x, ws[0], out=torch.zeros_like(out) if acc else None, accumulate=acc, norm_eps=eps, glu=glu)

        def cublas():
            for w in ws:
                if acc:
                    out.addmm_(x, w.t())
                elif glu:
                    swiglu(F.linear(x, w), norm=(x, 1e-5))
                else:
                    F.linear(x, w)

        def triton_fn(lp, pdl=False):
            def f():
                for w in ws:
                    linear(x, w, out=out if acc else None, accumulate=acc, norm_eps=eps, glu=glu, launch=lp, pdl=pdl)
            return f

        def trial(lp):
            got = linear(x, ws[0], out=torch.zeros_like(out) if acc else None, accumulate=acc, norm_eps=eps, glu=glu,
                         launch=lp, pdl=pdl)
            return bool(torch.allclose(got.float(), want.float(), rtol=2e-2, atol=2e-2)), _bench(triton_fn(lp, pdl), layers)

        base = _bench(cublas, layers)
        row = dict(shape=shape, gemm=name, m=m)
        rows.append(dict(row, impl="cublas", config=None, us=base, weight_mb=ws[0].numel() * 2 / 1e6))
        dflt = default_launch(m, k)
        choose(f"{shape:14s} {name:8s} m={m:3d}", gemm_key(m, n, k, glu, norm, acc), gemm_key(1, n, k, glu, norm, acc),
               base, "cublas", [dflt] + [c for c in configs(m, quick, n, k) if c != dflt], trial, rows, row,
               best_out, invariant, "triton-pdl" if pdl else "triton",
               (lambda lp: _bench(triton_fn(lp), layers)) if pdl else None, dflt)
        del ws


def run_rope(shape, m, layers, quick, rows, best_out, invariant=None, pdl=False, dev="cuda", draft=False):
    """The q|k|v projection with its RoPE and cache writes: as the step runs it without a rope entry
    (its q|k|v GEMM, on the kernel where `best_out` / the shipped table lists one, else cuBLAS, then
    rope_write's launch) against `linear_rope` at a grid of tiles (column tiles dividing D / 2).
    draft: the EAGLE-3 drafter's (`Eagle3MidLayer.qkv_write`): K = 2 H (the normed embedding and feature
    side by side), no norm folded into the GEMM."""
    from ssv.config import RopeConfig
    from ssv.model.layers import rope_cos_sin, rope_inv_freq
    from ssv.ops.glue.ops import rope_write
    from ssv.ops.linear.ops import linear_rope
    from ssv.ops.linear.policy import tuned_launch
    from ssv.ops.utils import device_name
    h, _, _ = LAYER[shape]
    hq, hkv, d = HEADS[shape]
    n, k = (hq + 2 * hkv) * d, 2 * h if draft else h
    eps = None if draft else 1e-5
    gen = torch.Generator(device=dev).manual_seed(1)
    ws = [torch.randn(n, k, device=dev, generator=gen).mul_(k ** -0.5).bfloat16() for _ in range(layers)]
    x = (torch.randn(m, k, device=dev, generator=gen) * 4).bfloat16()
    cos, sin = rope_cos_sin(torch.arange(8192, device=dev), rope_inv_freq(d, RopeConfig(theta=100000.0)).to(dev))
    pos = torch.arange(4000, 4000 + m, device=dev)
    slots = pos.clone()
    kc = torch.zeros(layers, hkv, 8192, d, device=dev, dtype=torch.bfloat16)
    vc = torch.zeros_like(kc)
    want = linear_rope(x, ws[0], cos, sin, hq, hkv, kc[0], vc[0], slots, norm_eps=eps, pos=pos, pdl=False).float()
    e = best_out.get(gemm_key(m, n, k, False, not draft, False))
    lq = (LinearLaunch(e.get("bm", row_tile(m)), e["bn"], e["bk"], e["warps"], e["stages"]) if e is not None
          else tuned_launch(device_name(torch.device(dev)), m, n, k, norm=not draft))

    def unfused():
        for i, w in enumerate(ws):
            if lq is not None:
                qkv, nrm = linear(x, w, norm_eps=eps, launch=lq, pdl=pdl), None
            else:
                qkv, nrm = F.linear(x, w), (None if draft else (x, 1e-5))
            rope_write(qkv, cos, sin, hq, hkv, kc[i], vc[i], slots, norm=nrm, pos=pos)

    def fused_fn(lp):
        def f():
            for i, w in enumerate(ws):
                linear_rope(x, w, cos, sin, hq, hkv, kc[i], vc[i], slots, norm_eps=eps, pos=pos, launch=lp, pdl=pdl)
        return f

    def trial(lp):
        got = linear_rope(x, ws[0], cos, sin, hq, hkv, kc[0], vc[0], slots, norm_eps=eps, pos=pos, launch=lp,
                          pdl=pdl).float()
        return bool(torch.allclose(got, want, rtol=2e-2, atol=2e-2)), _bench(fused_fn(lp), layers)

    base = _bench(unfused, layers)
    name = "draft_qkv_rope" if draft else "qkv_rope"
    row = dict(shape=shape, gemm=name, m=m)
    rows.append(dict(row, impl="gemm+rope_write", config=None if lq is None else lq.__dict__, us=base))
    choose(f"{shape:14s} {name} m={m:3d}", gemm_key(m, n, k, False, not draft, False, rope=True),
           gemm_key(1, n, k, False, not draft, False, rope=True), base,
           f"unfused ({'kernel' if lq else 'cuBLAS'} + rope_write)",
           [c for c in configs(m, quick, n, k) if (d // 2) % c.bn == 0], trial, rows, row, best_out, invariant,
           "triton-pdl" if pdl else "triton")


def add_args(p):
    p.add_argument("--out", default="bench/results", help="folder of probe-linear.json")
    p.add_argument("--quick", action="store_true", help="4 tiles a case (a smoke run)")
    p.add_argument("--shapes", nargs="+", default=["smollm2-135m"], choices=list(LAYER))
    p.add_argument("--rows", nargs="+", type=int, default=[1, 48])
    g = p.add_mutually_exclusive_group()
    g.add_argument("--tiles", help="merge the winning tiles into this table (its entry for this device replaced "
                                   "GEMM by GEMM)")
    g.add_argument("--save", action="store_true", help="merge them into this machine's table, "
                                                       "$SSV_CACHE/linear-tiles.json (read over the shipped one)")
    p.add_argument("--pdl", action="store_true",
                   help="time the kernel with programmatic dependent launch, as the step launches it on Hopper")
    p.add_argument("--batch-invariant", action="store_true",
                   help="list the AR step's tiles (16-row programs) for every larger M whose GEMM the AR step "
                        "takes the kernel for, where they are no slower than the baseline: every row's product "
                        "then equals the AR step's bitwise (without the flag they are timed and reported only)")
    p.add_argument("--rope", action="store_true",
                   help="also the q|k|v projection with RoPE and the cache writes in one launch (linear_rope) "
                        "against the GEMM and rope_write's launch")
    p.add_argument("--draft", action="store_true",
                   help="also the EAGLE-3 drafter's q|k|v with RoPE (K = 2 H, no folded norm) at its 8 frontier "
                        "rows, as --rope times the target's")


def merge_tiles(path: str, device: str, best: dict, timed: set, measured: str) -> None:
    """best into the table at path: this device's entries for the GEMMs timed now replaced (a run over
    other shapes or rows keeps the entries it did not time), the others' untouched."""
    table = json.load(open(path)) if os.path.exists(path) else {}
    mine = {k: v for k, v in table.get(device, {}).items() if k not in timed and not k.startswith("_")}
    table[device] = dict(sorted({**mine, **best}.items()), _measured=measured)
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        json.dump(table, f, indent=1, sort_keys=True)
        f.write("\n")


def cmd_bench_linear(a) -> int:
    if not torch.cuda.is_available():
        raise ValueError("ssv bench linear times CUDA graphs: it needs a CUDA device")
    rows, best = [], {}
    timed = {gemm_key(m, n, k, glu, norm, acc) for shape in a.shapes for m in a.rows
             for _, n, k, glu, norm, acc in gemms(shape)}
    if a.rope:
        timed |= {gemm_key(m, LAYER[s][2], LAYER[s][0], False, True, False, rope=True) for s in a.shapes for m in a.rows}
    if a.draft:
        timed |= {gemm_key(DRAFT_ROWS, LAYER[s][2], 2 * LAYER[s][0], False, False, False, rope=True) for s in a.shapes}
    for shape in a.shapes:
        for m in sorted(a.rows):   # M = 1 first: the larger M's batch-invariant tiles are its
            run(shape, m, 30 if shape == "smollm2-135m" else 4, a.quick, rows, best,
                None if m == 1 else dict(best, _take=a.batch_invariant), a.pdl)
            if a.rope:
                run_rope(shape, m, 30 if shape == "smollm2-135m" else 4, a.quick, rows, best,
                         None if m == 1 else dict(best, _take=a.batch_invariant), a.pdl)
        if a.draft:   # the draft tree's levels: no batch invariance to keep (its rows only propose)
            run_rope(shape, DRAFT_ROWS, 6, a.quick, rows, best, None, a.pdl, draft=True)
    env = environment()
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "probe-linear.json"), "w") as f:
        json.dump({"env": env, "rows": rows, "tiles": best}, f, indent=1)
    path = a.tiles or (str(user_tiles_path()) if a.save else None)
    if path:
        merge_tiles(path, env["device"], best, timed, f"{env['date'][:10]} {env['commit']}")
        print(f"{len(best)} entries for {env['device']} merged into {path}")
    return 0


def main(argv=None) -> int:
    import argparse
    p = argparse.ArgumentParser(prog="ssv bench linear", description=__doc__)
    add_args(p)
    return cmd_bench_linear(p.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
