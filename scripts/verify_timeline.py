"""Where a verify launch's time goes inside its programs: the kernel's source with clock stamps inserted at
its phases (entry, after the PDL wait, work list built, selected + window loop done, tree part done,
partial states stored, end), run on `gpu_probe.case` (PROBE_SHAPE / PROBE_T / PROBE_N as there).

  python3 scripts/verify_timeline.py ["exact4 defaults,naive defaults"]

Per variant: the launch's graphed time with and without the stamps (their cost), and per phase the
mean / p90 / max over programs of its SM cycles (%clock64) and the programs' spread in wall time
(%globaltimer). Not a benchmark: it answers which phase of the kernel is on the critical path.
"""
from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from verify_source import WithArg, patched_module  # noqa: E402

PHASES = [("pdl wait", 0, 1), ("work list", 1, 2), ("sel+win loop", 2, 3), ("tree part", 3, 4), ("store", 4, 5),
          ("fold merge", 5, 6)]
# (anchor line in verify_kernels.py's nsa_verify_fwd_kernel, slot stamped after it / before it)
AFTER = [("    i_g, i_h, i_z = tl.program_id(0), tl.program_id(1), tl.program_id(2)\n", 0),
         ("    pdl_prologue(PDL)\n    i_s, i_k", 1),
         ("    tl.debug_barrier()\n    it_lo, it_hi", 2)]
BEFORE = [("    # the step's new tokens, seen only along", 3),
          ("    p_l = o_qi64 * HQ + o_hq\n", 4),
          ("        if FOLD:\n", 5)]
STAMP = '''
@triton.jit
def _stamp(stamps, slot):
    i_p = (tl.program_id(0) * tl.num_programs(1) + tl.program_id(1)) * tl.num_programs(2) + tl.program_id(2)
    c = tl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)
    g = tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)
    tl.store(stamps + i_p.to(tl.int64) * 16 + slot, c)
    tl.store(stamps + i_p.to(tl.int64) * 16 + 8 + slot, g)

'''


def stamped_module():
    edits = []
    for anchor, slot in AFTER:   # the stamp after the anchor's first line (its own text kept whole)
        first, _, rest = anchor.partition("\n")
        edits.append((anchor, first + f"\n    _stamp(stamps, {slot})\n" + rest))
    for anchor, slot in BEFORE:
        ind = anchor[:len(anchor) - len(anchor.lstrip())]
        edits.append((anchor, f"{ind}_stamp(stamps, {slot})\n" + anchor))
    # the kernel's end: after the last _write of the non-split branch
    tail = "    else:\n        _write(b_m1, b_l1, b_a1, b_m2, b_l2, b_a2, p_l, p_o, m_r, gates, o_cmp, o, lse_a, lse_b, GATED)\n"
    edits.append((tail, tail + "    _stamp(stamps, 6)\n"))
    return patched_module("verify_kernels_stamped", "stamps", edits, STAMP)


def summarize(name, st, grid):
    st = st.view(-1, 16)[: grid[0] * grid[1] * grid[2]].double()
    clk, gt = st[:, :8], st[:, 8:]
    print(f"{name}: {st.shape[0]} programs; wall {(gt[:, 6].max() - gt[:, 0].min()) / 1e3:.2f} us from the first "
          f"start to the last end; starts spread {(gt[:, 0].max() - gt[:, 0].min()) / 1e3:.2f} us", flush=True)
    print(f"  {'phase':14s} {'mean':>8s} {'p90':>8s} {'max':>8s}  (SM cycles)   {'ends at (us from first start)':>30s}")
    t0 = gt[:, 0].min()
    for ph, a, b in PHASES:
        if a == 4 and not (clk[:, 5] > 0).any():
            b = 6   # no KV splits: no partial states, the end follows the output's store
        ok = (clk[:, a] > 0) & (clk[:, b] > 0)
        d = clk[ok, b] - clk[ok, a]
        if d.numel() == 0:
            print(f"  {ph:14s} (not stamped)")
            continue
        end = (gt[ok, b] - t0) / 1e3
        print(f"  {ph:14s} {d.mean():8.0f} {d.quantile(0.9):8.0f} {d.max():8.0f}   ends mean {end.mean():6.2f} "
              f"max {end.max():6.2f}", flush=True)
    tot = clk[:, 6] - clk[:, 0]
    print(f"  {'total':14s} {tot.mean():8.0f} {tot.quantile(0.9):8.0f} {tot.max():8.0f}", flush=True)


def main() -> int:
    sys.path.insert(0, os.path.dirname(__file__))
    import gpu_probe as P
    import ssv.ops.nsa.verify as V
    import ssv.ops.nsa.verify_policy as VP
    from ssv.bench.env import bench_graph
    shape = os.environ.get("PROBE_SHAPE", "smollm2-135m")
    T, N = int(os.environ.get("PROBE_T", "4096")), int(os.environ.get("PROBE_N", "48"))
    c = P.case(shape, T=T, N=N)
    if "TREE_COST" in os.environ:   # the split-0 balance's weight of a tree tile (verify_policy.TREE_COST)
        VP.TREE_COST = int(os.environ["TREE_COST"])
    print(f"# TREE_COST {VP.TREE_COST}", flush=True)
    names = (sys.argv[1] if len(sys.argv) > 1 else "exact4 defaults,naive defaults").split(",")
    print(f"# shape {shape}, context {T}, {N} tree queries", flush=True)
    mod = stamped_module()
    orig = V.nsa_verify_fwd_kernel
    for name, *cfg in P.VARIANTS:
        if name not in names:
            continue
        f, out = P.launcher(c, *cfg)
        V.nsa_verify_fwd_kernel, VP.nsa_verify_fwd_kernel = orig, orig
        ms0, _ = bench_graph(f, reps=50)
        stamps = torch.zeros(1 << 16, device="cuda", dtype=torch.int64)
        V.nsa_verify_fwd_kernel = VP.nsa_verify_fwd_kernel = stamped = WithArg(mod.nsa_verify_fwd_kernel, stamps)
        ms1, _ = bench_graph(f, reps=50)
        stamps.zero_()
        f()
        torch.cuda.synchronize()
        V.nsa_verify_fwd_kernel, VP.nsa_verify_fwd_kernel = orig, orig
        f.out = out
        err = P.check(c, f, cfg[0], cfg[1])
        grids = stamped.grids
        print(f"\n{name}: graphed {ms0 * 1e3:.1f} us, with stamps {ms1 * 1e3:.1f} us; grid {grids[-1]}; rel.err vs "
              f"per-query {err:.1e}", flush=True)
        summarize(name, stamps.cpu(), grids[-1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
