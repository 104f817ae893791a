"""How much of the verify launch is its prologue (the group's union, the work list written to scratch, their
barriers)? A bound, not a kernel: a copy of `verify_kernels.py` (`verify_source.patched_module`, the product
untouched) gains a PREBUILT argument; `record` runs the launch as the product does and also leaves the union's
count beside the work list, then `prebuilt` launches skip the build and read the list a previous launch left.
Same inputs, so the output must match. If `prebuilt` is not much faster than `default`, building the work list
elsewhere (in the routing's top-n, once per group and head) cannot pay.
    python3 scripts/probe_verify_prologue.py OUT.json   (PYTHONPATH at the package; CUDA)
Cases: the default model at 4K with 48 tree queries (strict's C = 4), and Llama-3.1-8B's shape at 64K / 64."""
import datetime
import inspect
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_probe import case  # noqa: E402
from verify_source import WithArg, patched_module  # noqa: E402

import ssv.ops.nsa.verify as V  # noqa: E402
import ssv.ops.nsa.verify_kernels as VK  # noqa: E402
from ssv.bench.kernels import bench_graph  # noqa: E402

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


class Prebuilt(WithArg):
    """The patched kernel in the launcher's place, PREBUILT = value, its work lists in one scratch buffer that
    outlives the launches (the launcher's own is allocated per call, in a captured graph's pool)."""

    def __init__(self, kernel, value, items):
        super().__init__(kernel, value)
        self.items = items

    def _args(self, args):
        assert args[ITEMS_AT].numel() <= self.items.numel()
        return super()._args(args[:ITEMS_AT] + (self.items,) + args[ITEMS_AT + 1:])


def run_case(name, c, mod, rows):
    out = torch.empty_like(c["q"])
    items = torch.zeros(1 << 20, device=c["q"].device, dtype=torch.int32)
    orig = V.nsa_verify_fwd_kernel

    def f():
        V.nsa_verify(c["q"], c["k"], c["v"], c["T"], c["pos"], c["tm"], c["idx"], c["cfg"].slc_block,
                     c["cfg"].window, group_size=4, out=out, lazy=True)
    res = {}
    for form in ("default", "record", "prebuilt", "default again"):
        V.nsa_verify_fwd_kernel = orig if form.startswith("default") else Prebuilt(mod.nsa_verify_fwd_kernel, False,
                                                                                    items)
        try:
            if form == "prebuilt":   # the list a record launch left
                f()
                V.nsa_verify_fwd_kernel = Prebuilt(mod.nsa_verify_fwd_kernel, True, items)
            f()
            torch.cuda.synchronize()
            res[form] = out.clone()
            ms, how = bench_graph(f, reps=50)
            torch.cuda.synchronize()
            after = torch.equal(out, res["default"])   # the replays' output
        finally:
            V.nsa_verify_fwd_kernel = orig
        same = torch.equal(res[form], res["default"]) and after
        rows.append({"case": name, "form": form, "us": ms * 1e3, "timing": how, "same_as_default": same})
        print(f"{name:28s} {form:14s} {ms * 1e3:8.2f} us  same {same}", flush=True)


def main():
    mod = prebuilt_module()
    rows = []
    for name, shape, T, N in (("smollm2-135m 4K / 48, C=4", "smollm2-135m", 4096, 48),
                              ("llama3.1-8b 64K / 64, C=4", "llama3.1-8b", 65536, 64)):
        run_case(name, case(shape, T=T, N=N), mod, rows)
    json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
               "commit": os.environ.get("SSV_COMMIT", "?"),
               "date": datetime.datetime.now(datetime.timezone.utc).isoformat(), "rows": rows},
              open(sys.argv[1], "w"), indent=1)


if __name__ == "__main__":
    main()
