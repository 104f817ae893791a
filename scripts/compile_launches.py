"""Compile for sm_90, on a machine without a GPU (triton's own ptxas), every kernel `nsa_route` and
`nsa_verify` launch at the shapes of the product's steps: each launcher runs on CPU tensors with its
kernels replaced by recorders, and each recorded launch (its arguments' types, its constexprs, its
warps; PDL on and tensor descriptors on, as on Hopper) is compiled. A layout Triton cannot lower for
one shape fails here before any device time is spent: session 37 found the transposed importance
sweep (7085361) failing to compile at BM = 16 (the AR step at Llama 64K) only on an H100.
The verify launches: strict C = 1 and 4, approximate C = 16, with and without a KV-split combine launch;
the dense plan's (`ssv.ops.dense.dense_verify` and its merge).
Not covered: miscompiles (code that builds and computes wrong: session 38's one-warp top-n tail; the
GPU tests find those). Prints one line a launch; exits 1 on a failure. tests/ops/test_compile_launches.py
runs it.
    python scripts/compile_launches.py [--quick]
"""
from __future__ import annotations

import contextlib
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sm90 import compile_sm90  # noqa: E402

import ssv.ops.dense.ops as dense  # noqa: E402
import ssv.ops.nsa.route as route  # noqa: E402
import ssv.ops.nsa.verify as verify  # noqa: E402
from ssv.bench.synthetic import SHAPES  # noqa: E402
from ssv.config import NSAConfig  # noqa: E402
from ssv.ops.nsa.naive import num_cmp_blocks  # noqa: E402

# (shape, context, queries): the AR step and the 48-node verify pass, one sweep and two
CASES = [("llama3.1-8b", 65536, 1), ("llama3.1-8b", 65536, 48), ("llama3.1-8b", 131072, 64),
         ("smollm2-135m", 4096, 1), ("smollm2-135m", 4096, 48)]
QUICK = [0, 1, 4]
KERNELS = ("nsa_route_score_fwd_kernel", "nsa_route_imp_fwd_kernel", "nsa_route_topk_fwd_kernel",
           "nsa_route_merge_topk_fwd_kernel")
SHOWN = ("C", "BM", "BS", "APPROX", "SPLIT", "FOLD", "BJ", "BT", "PF", "NSP")   # the constexprs a line shows
VERIFY_KERNELS = ("nsa_verify_fwd_kernel", "nsa_verify_combine_kernel")
DENSE_KERNELS = ("dense_verify_fwd_kernel", "dense_verify_combine_kernel")
TYPES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.int32: "i32",
         torch.int64: "i64", torch.uint8: "u8"}


class Recorder:
    def __init__(self, name, fn, launches):
        self.name, self.fn, self.launches = name, fn, launches

    def __getitem__(self, grid):
        def launch(*args, num_warps=4, **const):
            self.launches.append((self.name, self.fn, args, num_warps, const))
        return launch


def arg_type(a):
    from triton.tools.tensor_descriptor import TensorDescriptor
    if isinstance(a, torch.Tensor):
        return "*" + TYPES[a.dtype]
    if isinstance(a, TensorDescriptor):
        return f"tensordesc<{TYPES[a.base.dtype]}[{','.join(map(str, a.block_shape))}]>"
    if isinstance(a, bool):
        return "i1"
    return "fp32" if isinstance(a, float) else "i32"


@contextlib.contextmanager
def recording(module, kernels, launches):
    """The launcher module's kernels replaced by recorders appending to `launches`, and its SM count an
    H100's, for the duration."""
    saved = {n: getattr(module, n) for n in kernels}
    sm = module.sm_count
    try:
        for n, fn in saved.items():
            setattr(module, n, Recorder(n, fn, launches))
        module.sm_count = lambda dev: 132
        yield
    finally:
        for n, fn in saved.items():
            setattr(module, n, fn)
        module.sm_count = sm


def record(shape, T, N):
    hq, hkv, d = SHAPES[shape]
    cfg = NSAConfig()
    nb = num_cmp_blocks(T, cfg)
    bf = dict(dtype=torch.bfloat16)
    q = torch.zeros(N, hq, d, **bf)
    kc, vc = torch.zeros(hkv, nb, d, **bf), torch.zeros(hkv, nb, d, **bf)
    k = torch.zeros(hkv, T + N, d, **bf)
    pos = T + torch.arange(N)   # a chain's positions: the launches' shapes do not depend on the tree
    mask = torch.ones(N, N, dtype=torch.bool).tril()
    plen = torch.tensor([T], dtype=torch.int32)
    w, s0, npath = route.path_block_weights_device(plen, pos, mask, cfg)
    launches = []
    with recording(route, KERNELS, launches):
        route.nsa_route(q, kc, vc, torch.tensor([nb], dtype=torch.int32), k, k, w, s0, npath, pos, cfg,
                        max_pos=T + N - 1, tma=True)
    return launches


def record_verify(shape, T, N):
    """The verify launches of one step: the cache's capacity T + N, the prefix length on the device (a
    graphed step's form), the plan's selections (all -1 here: the launch does not depend on them)."""
    hq, hkv, d = SHAPES[shape]
    cfg = NSAConfig()
    bf = dict(dtype=torch.bfloat16)
    q = torch.zeros(N, hq, d, **bf)
    k = torch.zeros(hkv, T + N, d, **bf)
    pos = T + torch.arange(N, dtype=torch.int32)
    mask = torch.ones(N, N, dtype=torch.uint8).tril()
    plen = torch.tensor([T], dtype=torch.int32)
    idx = torch.full((N, hkv, cfg.n_select), -1, dtype=torch.int32)
    forms = [(1, False)] if N == 1 else [(1, False), (4, False), (16, True)]
    launches = []
    with recording(verify, VERIFY_KERNELS, launches):
        for c, approx in forms:
            for fold in (None, False):   # the policy's merge, and the split form's combine launch
                verify.nsa_verify(q, k, k, plen, pos, mask, idx, cfg.slc_block, cfg.window, group_size=c,
                                  approx=approx, tma=True, fold=fold, n_split=None if fold is None else 4)
    with recording(dense, DENSE_KERNELS, launches):   # the dense plan's AR step and trees
        dense.dense_verify(q, k, k, plen, mask, tma=True)
    return launches


def compile_args(fn, args, const) -> tuple:
    """(signature, constexprs, num_stages) of one recorded launch, as `compile_sm90` takes them."""
    names = list(fn.arg_names)
    sig = {n: arg_type(a) for n, a in zip(names, args)}
    consts = {k: v for k, v in const.items() if k in names}
    consts["PDL"] = True   # a superset: verify takes PDL where its policy says it pays
    return sig, consts, const.get("num_stages")


def header() -> str:
    """What compiled: the target, triton's and torch's versions, the date and the commit."""
    import datetime
    import triton
    from ssv.bench.env import commit
    date = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    return f"# sm_90 (triton {triton.__version__}'s ptxas), torch {torch.__version__}, {date}, commit {commit()}"


def main(quick: bool) -> int:
    print(header(), flush=True)
    bad, seen = 0, set()
    for i, (shape, T, N) in enumerate(CASES):
        if quick and i not in QUICK:
            continue
        for name, fn, args, warps, const in record(shape, T, N) + record_verify(shape, T, N):
            sig, const, stages = compile_args(fn, args, const)
            key = (name, tuple(sorted(sig.items())), tuple(sorted(const.items())), warps, stages)
            if key in seen:
                continue
            seen.add(key)
            t0 = time.time()
            try:
                cc, reg = compile_sm90(fn, sig, const, warps, stages)
                res = f"REG/STACK/SHARED {'/'.join(reg)}"
                ptx = cc.asm["ptx"]   # the L2 prefetch of the KV a kernel reads: before the PDL wait only
                n_pf, wait = ptx.count("prefetch.global.L2"), ptx.find("griddepcontrol.wait")
                res += f" prefetch {n_pf} {('before' if ptx.rfind('prefetch.global.L2') < wait else 'AFTER') if n_pf else '-'}"
            except Exception as e:  # noqa: BLE001 - the report is the point
                bad += 1
                res = f"FAILED {type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"
            form = " ".join(f"{k}={int(const[k])}" for k in SHOWN if k in const)
            short = name.replace('nsa_', '').replace('_fwd_kernel', '').replace('_kernel', '')
            print(f"{shape:13s} {T:6d} {N:3d} {short:17s} "
                  f"{warps} warps  {res}  ({time.time() - t0:.1f} s)  {form}", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    os.environ.pop("TRITON_INTERPRET", None)
    sys.exit(main("--quick" in sys.argv))
