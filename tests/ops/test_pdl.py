"""Programmatic dependent launch (ssv/ops/pdl.py): every kernel of the step opens with the prologue and
every launch passes the flag (read from the source, so a new kernel without them fails here); on a
Hopper GPU, long chains of dependent PDL launches equal plain launches bit for bit, eager and graphed."""
import ast
import pathlib

import pytest
import torch

from ssv.ops.glue.naive import rmsnorm_naive
from ssv.ops.glue.ops import rmsnorm
from ssv.ops.linear.ops import linear
from ssv.ops.pdl import pdl, pdl_args

OPS = pathlib.Path(__file__).resolve().parents[2] / "ssv" / "ops"
CUDA = torch.cuda.is_available()
HOPPER = CUDA and torch.cuda.get_device_capability()[0] >= 9


def _jit_kernels():
    for path in sorted(OPS.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and node.name.endswith("_kernel") and any(
                    ast.unparse(d).endswith("jit") for d in node.decorator_list):
                yield path, node


def _launches():
    for path in sorted(OPS.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Subscript)
                    and ast.unparse(node.func.value).endswith("_kernel")):
                yield path, node


def test_every_kernel_opens_with_the_prologue():
    kernels = list(_jit_kernels())
    assert len(kernels) >= 18   # the step's kernels: glue, linear, routing, verify, tree, accept, commit, ...
    for path, fn in kernels:
        args = [a.arg for a in fn.args.args]
        assert args[-1] == "PDL" and ast.unparse(fn.args.defaults[-1]) == "False", (path.name, fn.name)
        body = [ast.unparse(st) for st in fn.body]
        assert "pdl_prologue(PDL)" in body, (path.name, fn.name)
        before = body[:body.index("pdl_prologue(PDL)")]
        # before the wait only index arithmetic and the weights' L2 prefetch: no load, store or exit
        for st in before:
            assert not any(w in st for w in ("tl.load", "tl.store", "atomic", "return", "tl.device_assert")), \
                (path.name, fn.name, st)
        assert not before or any("l2_prefetch_" in st for st in before), (path.name, fn.name, before)


def test_weights_prefetch_precedes_the_wait_and_compiles_for_sm90():
    """The GEMM kernels' L2 prefetch (ssv/ops/pdl.py: l2_prefetch_rows) is emitted only with PDL and
    lands before griddepcontrol.wait, a prefetch a thread per 128-byte line of its rows (K = 576: 9
    lines, 2 chunks of 8 over [32, 8] elements on 128 threads; K = 1536: 3 chunks)."""
    import os
    import subprocess
    import sys
    import triton
    if not os.path.exists(os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")):
        pytest.skip("triton's bundled ptxas is not installed")
    root = OPS.parents[1]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(root) + os.pathsep + env.get("PYTHONPATH", "")
    r = subprocess.run([sys.executable, str(root / "scripts" / "compile_linear_sm90.py")], env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = {ln.split(" REG")[0]: dict(zip(ln.split()[-8::2], ln.split()[-7::2])) for ln in r.stdout.splitlines()}
    want = {"linear o": 4, "linear gate_up": 8, "linear down": 6, "linear qkv": 4, "linear down tap": 6,
            "linear_rope qkv": 8, "linear_rope draft_qkv": 12}
    assert len(rows) == 2 * len(want)
    for name, n in want.items():
        on, off = rows[f"{name} pdl=True"], rows[f"{name} pdl=False"]
        assert (on["prefetch_ptx"], on["prefetch_sass"], on["waits"], on["before_wait"]) == (str(n), str(n), "1", "True")
        assert (off["prefetch_ptx"], off["prefetch_sass"], off["waits"]) == ("0", "0", "0"), name


def test_every_launch_passes_the_flag():
    launches = list(_launches())
    assert len(launches) >= 18
    for path, call in launches:
        named = {k.arg for k in call.keywords}
        splats = [ast.unparse(k.value) for k in call.keywords if k.arg is None]
        ok = "PDL" in named or any(s.startswith("pdl_args(") or s == "pk" for s in splats)
        assert ok, (path.name, ast.unparse(call.func))


def test_off_without_hopper():
    assert not pdl(torch.device("cpu"))
    assert pdl_args(torch.device("cpu")) == {"PDL": False}
    if CUDA:
        assert pdl(torch.device("cuda")) == HOPPER
        assert pdl_args(torch.device("cuda")).get("launch_pdl", False) == HOPPER


@pytest.mark.cuda
@pytest.mark.skipif(not HOPPER, reason="programmatic dependent launch needs a Hopper (or newer) GPU")
@pytest.mark.parametrize("graphed", [False, True])
def test_dependent_chain_equals_plain_launches(graphed):
    """64 launches, each reading the one before's output (two buffers in turn) through small grids that
    finish unevenly, interleaved with RMSNorm launches: a launch that read before its predecessor
    completed would see the stale buffer, which differs from the fresh one in every entry."""
    g = torch.Generator().manual_seed(0)
    dev = torch.device("cuda")
    w = (torch.randn(64, 64, generator=g) / 8).to(torch.bfloat16).to(dev)
    nw = (1 + 0.1 * torch.randn(64, generator=g)).to(torch.bfloat16).to(dev)
    x0 = torch.randn(3, 64, generator=g).to(torch.bfloat16).to(dev)
    bufs = [torch.empty(3, 64, device=dev, dtype=torch.bfloat16) for _ in range(2)]

    def chain(pdl_on):
        a, b = bufs
        a.copy_(x0)
        for i in range(32):
            linear(a, w, out=b, pdl=pdl_on)
            if i % 4 == 3:
                rmsnorm(b, nw, 1e-5, out=a)   # the library's own launch (PDL on this GPU)
                a, b = b, a
            linear(b, w, out=a, pdl=pdl_on)
        return a.clone()

    want = chain(False)
    if graphed:
        chain(True)   # compile outside the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = chain(True)
        for _ in range(3):
            bufs[0].fill_(float("nan"))
            bufs[1].fill_(float("nan"))
            graph.replay()
            torch.cuda.synchronize()
            assert torch.equal(out, want)
    else:
        assert torch.equal(chain(True), want)
    # and the chain computes what the fp32 twin does step by step (not a constant)
    ref = x0.float()
    for i in range(32):
        y = (ref.to(torch.bfloat16).float() @ w.float().t()).to(torch.bfloat16).float()
        if i % 4 == 3:
            y = rmsnorm_naive(y.to(torch.bfloat16), nw, 1e-5).float()
        ref = (y.to(torch.bfloat16).float() @ w.float().t()).to(torch.bfloat16).float()
    assert torch.isfinite(want).all() and (want.float() - ref).norm() < 0.1 * ref.norm()


def test_verify_policy_plain_for_per_query_launches_over_many_queries():
    from ssv.ops.nsa.verify_policy import pdl_pays
    assert pdl_pays(1, 1) and pdl_pays(48, 4) and pdl_pays(48, 16)   # the AR step, strict, approximate
    assert not pdl_pays(48, 1)                                        # sd-naive's launch


@pytest.mark.parametrize("C", [1, 4])
def test_verify_asks_its_policy(C, monkeypatch):
    """nsa_verify takes PDL through `pdl_pays(N, C)`: where the policy says no, the device is not
    asked and the launch is plain."""
    import ssv.ops.nsa.verify as verify
    from ssv.config import NSAConfig
    from ssv.ops.nsa.naive import nsa_naive
    from .test_nsa_kernels import CFG, DEV, DTYPES, make_case
    asked, devices = [], []
    monkeypatch.setattr(verify, "pdl_pays", lambda n, c: asked.append((n, c)) or c > 1)
    monkeypatch.setattr(verify, "pdl_args", lambda dev: devices.append(dev) or {"PDL": False})
    cfg = NSAConfig(**CFG)
    q, k, v, pos, mask, _ = make_case(3, 150, 7, 2, 2, 16, DTYPES[0], cfg)
    idx = nsa_naive(q.float(), k.float(), v.float(), 150, pos, mask, cfg).block_indices
    verify.nsa_verify(q.to(DEV), k.to(DEV), v.to(DEV), 150, pos.to(DEV), mask.to(DEV), idx.to(DEV),
                      cfg.slc_block, cfg.window, group_size=C)
    assert asked == [(7, C)] and len(devices) == (C > 1)
