"""How much of the verify launch is its prologue (the group's union, the work list written to scratch, their
barriers)? A bound, not a kernel: a copy of `verify_kernels.py` (`verify_source.patched_module`, the product
untouched) gains a PREBUILT argument; `record` runs the launch as the product does and also leaves the union's
count beside the work list, then `prebuilt` launches skip the build and read the list a previous launch left.
Same inputs, so the output must match. If `prebuilt` is not much faster than `default`, building the work list
elsewhere (in the routing's top-n, once per group and head) cannot pay. `bitmask` is one such form: the prologue
reads the group's selections as row masks (made here on the host from the indices; the routing's top-n would
write them) instead of comparing the entries pairwise.
    python3 scripts/probe_verify_prologue.py OUT.json   (PYTHONPATH at the package; CUDA)
    python3 scripts/probe_verify_prologue.py --sass     (no GPU: the forms' static sm_90 counts)
Cases: the default model at 4K with 48 tree queries (strict's C = 4), and Llama-3.1-8B's shape at 64K / 64."""
import datetime
import inspect
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_probe import case  # noqa: E402
from verify_source import ARG_AT, WithArg, patched_module  # noqa: E402

import ssv.ops.nsa.verify as V  # noqa: E402
import ssv.ops.nsa.verify_kernels as VK  # noqa: E402
from ssv.bench.env import bench_graph  # noqa: E402

KEEP = ("    n_w = ", "    o_t0 = ", "    kbase = ", "    vbase = ", "    o_qb = ", "    p_it = ")
ITEMS_AT = 16   # the launcher's positional argument `items` (verify.py's `args`)


def prebuilt_module():
    """verify_kernels.py with a PREBUILT argument: the build region (from the union's entries to the barrier
    after the work list) runs only when it is off, and then also stores the union's count in the tree bits'
    last slot (unused at these shapes: the tree's 48-64 tokens span at most 2 blocks)."""
    src = inspect.getsource(VK)
    a = src.index("    o_eq, b_e, m_e = _entries(")
    b = src.index("    it_lo, it_hi = _item_range(")
    region = src[a:b].splitlines(keepends=True)
    keep = [ln for ln in region if ln.startswith(KEEP)]
    build = [("    " + ln if ln.strip() else ln) for ln in region if ln not in keep]
    new = ("".join(keep) + "    if PREBUILT:\n        n_a = tl.load(p_it + 2 * (CE + NWP) + NTB - 1)\n    else:\n"
           + "".join(build) + "        tl.store(p_it + 2 * (CE + NWP) + NTB - 1, n_a)\n")
    return patched_module("verify_kernels_prebuilt", "PREBUILT: tl.constexpr", [(src[a:b], new)])


BITMASK = """    # the group's selections from the routing's row masks (bmask [N, Hkv, NBM], 1 = selected): bit c of
    # block b = query c of the group selected it; no pair compares, the window's and tree's bits loaded
    o_b = tl.arange(0, NBM)
    o_c = tl.arange(0, CQ)
    m_c = (o_c < C) & (i_g * C + o_c < N)
    p_bm = bmask + (i_g * C + o_c).to(tl.int64)[:, None] * s_mn + i_h * s_mh
    b_bits = tl.sum(tl.load(p_bm + o_b[None, :], mask=m_c[:, None], other=0).to(tl.int32) << o_c[:, None], 0)
    m_first = (b_bits != 0) & (o_b < lim)
    b_rank = tl.cumsum(m_first.to(tl.int32), 0) - 1
    n_a = tl.sum(m_first.to(tl.int32))
    tl.store(p_it + 2 * b_rank, o_b, mask=m_first)
    tl.store(p_it + 2 * b_rank + 1, b_bits, mask=m_first)
    for w0 in range(0, n_w, 64):
        o_w = w0 + tl.arange(0, 64)
        m_w = o_w < n_w
        b_wb = tl.sum(tl.load(p_bm + (lim + o_w)[None, :], mask=m_c[:, None] & m_w[None, :], other=0).to(tl.int32)
                      << o_c[:, None], 0)
        tl.store(p_it + 2 * (n_a + o_w), lim + o_w, mask=m_w)
        tl.store(p_it + 2 * (n_a + o_w) + 1, b_wb, mask=m_w)
    o_u = tl.arange(0, NTB)
    m_u = P // BS + o_u < NBM
    b_ub = tl.sum(tl.load(p_bm + (P // BS + o_u)[None, :], mask=m_c[:, None] & m_u[None, :], other=0).to(tl.int32)
                  << o_c[:, None], 0)
    tl.store(p_it + 2 * (CE + NWP) + o_u, b_ub)
    tl.debug_barrier()
"""


def bitmask_module():
    """verify_kernels.py whose prologue reads the group's selections as row masks (what the routing's top-n
    could write beside its indices) instead of comparing the entries pairwise: the list's union blocks in
    ascending order (the default keeps entry order, so sums differ in order only)."""
    src = inspect.getsource(VK)
    a = src.index("    o_eq, b_e, m_e = _entries(")
    b = src.index("    it_lo, it_hi = _item_range(")
    keep = [ln for ln in src[a:b].splitlines(keepends=True) if ln.startswith(KEEP)]
    return patched_module("verify_kernels_bitmask", "bmask, s_mn, s_mh, NBM: tl.constexpr",
                          [(src[a:b], "".join(keep) + BITMASK)])


def row_masks(idx: torch.Tensor, nbm: int) -> torch.Tensor:
    """[N, Hkv, nbm] uint8: 1 where the query selected the block (idx [N, Hkv, n], -1 padded)."""
    m = torch.zeros(*idx.shape[:2], nbm + 1, dtype=torch.uint8, device=idx.device)
    m.scatter_(2, torch.where(idx >= 0, idx.long(), nbm), 1)
    return m[:, :, :nbm].contiguous()


class Masks(WithArg):
    """The bitmask kernel in the launcher's place, with the row masks as its added arguments."""

    def __init__(self, kernel, masks):
        super().__init__(kernel, None)
        self.masks = masks

    def _args(self, args):
        m = self.masks
        return args[:ARG_AT] + (m, m.stride(0), m.stride(1), m.shape[2]) + args[ARG_AT:]


class Prebuilt(WithArg):
    """The patched kernel in the launcher's place, PREBUILT = value, its work lists in one scratch buffer that
    outlives the launches (the launcher's own is allocated per call, in a captured graph's pool)."""

    def __init__(self, kernel, value, items):
        super().__init__(kernel, value)
        self.items = items

    def _args(self, args):
        assert args[ITEMS_AT].numel() <= self.items.numel()
        return super()._args(args[:ITEMS_AT] + (self.items,) + args[ITEMS_AT + 1:])


def run_case(name, c, mods, rows):
    """Each form's launch (graphed, bench_graph) and its output against the default's: equal for record and
    prebuilt (the same sums), a relative error for bitmask (the union's blocks in another order)."""
    out = torch.empty_like(c["q"])
    items = torch.zeros(1 << 20, device=c["q"].device, dtype=torch.int32)
    nbm = 1 << (int(c["pos"].max()) // c["cfg"].slc_block + 1).bit_length()   # a power of two past the last block
    forms = {"default": None, "bitmask": Masks(mods["bitmask"].nsa_verify_fwd_kernel, row_masks(c["idx"], nbm)),
             "record": Prebuilt(mods["prebuilt"].nsa_verify_fwd_kernel, False, items),
             "prebuilt": Prebuilt(mods["prebuilt"].nsa_verify_fwd_kernel, True, items), "default again": None}
    orig = V.nsa_verify_fwd_kernel

    def f():
        V.nsa_verify(c["q"], c["k"], c["v"], c["T"], c["pos"], c["tm"], c["idx"], c["cfg"].slc_block,
                     c["cfg"].window, group_size=4, out=out, lazy=True)
    ref = None
    for form, kern in forms.items():
        try:
            if form == "prebuilt":   # the list a record launch left
                V.nsa_verify_fwd_kernel = forms["record"]
                f()
            V.nsa_verify_fwd_kernel = orig if kern is None else kern
            f()
            torch.cuda.synchronize()
            first = out.float().clone()
            ref = first if ref is None else ref
            ms, how = bench_graph(f, reps=50)
            torch.cuda.synchronize()
            err = max((x - ref).norm().item() / ref.norm().item() for x in (first, out.float()))  # and the replays'
        finally:
            V.nsa_verify_fwd_kernel = orig
        rows.append({"case": name, "form": form, "us": ms * 1e3, "timing": how, "rel_err_vs_default": err,
                     "mask_blocks": nbm if form == "bitmask" else None})
        print(f"{name:28s} {form:14s} {ms * 1e3:8.2f} us  rel.err vs default {err:.1e}", flush=True)


def sass_counts():
    """No GPU: each form's static sm_90 SASS (triton's own ptxas) at the default model's strict launch (C = 4,
    4K, 48 queries), and how much of it comes before the first K/V tile load."""
    import re
    from compile_launches import compile_args, record_verify
    from sm90 import compile_sm90, sass_lines
    launches = [x for x in record_verify("smollm2-135m", 4096, 48) if x[0] == "nsa_verify_fwd_kernel"]
    _, fn, args, warps, const = next(x for x in launches if x[4].get("C") == 4 and not x[4].get("APPROX"))
    sig, consts, stages = compile_args(fn, args, const)
    forms = [("default", fn, sig, consts),
             ("bitmask", bitmask_module().nsa_verify_fwd_kernel, dict(sig, bmask="*u8", s_mn="i32", s_mh="i32"),
              dict(consts, NBM=128)),
             ("prebuilt", prebuilt_module().nsa_verify_fwd_kernel, sig, dict(consts, PREBUILT=True))]
    kinds = ("LDG", "STG", "BAR", "SHFL", "ISETP", "LOP3", "IMAD")
    for name, kern, sg, cs in forms:
        cc, use = compile_sm90(kern, sg, cs, warps, stages)
        ops = [re.sub(r"^\s*/\*[0-9a-f]+\*/\s*(@!?U?P\w+\s+)?", "", ln).split()[0] for ln in sass_lines(cc)]
        cut = next(i for i, o in enumerate(ops) if o.startswith("UTMALDG"))
        print(f"{name:9s} REG {use[0]} SASS {len(ops)}, before the first tile {cut}: "
              + " ".join(f"{k} {sum(o.startswith(k) for o in ops[:cut])}" for k in kinds))


def main():
    if sys.argv[1:] == ["--sass"]:
        return sass_counts()
    mods = {"prebuilt": prebuilt_module(), "bitmask": bitmask_module()}
    rows = []
    for name, shape, T, N in (("smollm2-135m 4K / 48, C=4", "smollm2-135m", 4096, 48),
                              ("llama3.1-8b 64K / 64, C=4", "llama3.1-8b", 65536, 64)):
        run_case(name, case(shape, T=T, N=N), mods, rows)
    json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
               "commit": os.environ.get("SSV_COMMIT", "?"),
               "date": datetime.datetime.now(datetime.timezone.utc).isoformat(), "rows": rows},
              open(sys.argv[1], "w"), indent=1)


if __name__ == "__main__":
    main()
