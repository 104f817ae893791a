"""Routing's and verification's launches at the product's shapes compile for sm_90 (Hopper) with
triton's own ptxas, no GPU needed: the interpreter tests run the kernels' math but never lower their
layouts, and session 37 found one (the transposed importance sweep at 16 rows, the AR step at Llama
64K) that only an H100 refused (scripts/compile_launches.py)."""
import os
import subprocess
import sys

import pytest
import triton

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PTXAS = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")


def _compile_script(name: str, timeout: int) -> subprocess.CompletedProcess:
    """scripts/<name> in a fresh interpreter, compiling (not interpreting) its kernels."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, os.path.join(ROOT, "scripts", name)], env=env, capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.skipif(not os.path.exists(PTXAS), reason="triton's bundled ptxas is not installed")
def test_route_and_verify_launches_compile_for_sm90():
    r = _compile_script("compile_launches.py", 900)
    lines = [x for x in r.stdout.splitlines() if "warps" in x]
    assert r.returncode == 0, "\n".join(x for x in lines if "FAILED" in x) or r.stderr[-2000:]
    assert not any("FAILED" in x for x in lines)
    # every case launched its kernels: score + imp + top-n (two sweeps) or score + merge (one), and
    # the verify forms (strict C = 1 / 4, approximate C = 16, the dense plan's, the split combine)
    kernels = {x.split()[3] for x in lines}
    assert kernels == {"route_score", "route_imp", "route_topk", "route_merge_topk", "verify", "verify_combine",
                       "dense_verify", "dense_verify_combine"}
    assert len(lines) >= 25 and sum(x.split()[3] == "verify" for x in lines) >= 8
    assert sum(x.split()[3] == "dense_verify" for x in lines) >= 3   # the AR step and trees, two shapes
    # the KV the verify and score launches read first (the window; the compressed keys) is prefetched
    # into L2 before their PDL wait, and nowhere after it (ssv/ops/pdl.py)
    assert not any("AFTER" in x for x in lines)
    for x in lines:
        n_pf = int(x.split(" prefetch ")[1].split()[0])
        if x.split()[3] == "dense_verify":   # where its policy prefetches (ssv/ops/dense/policy.py)
            assert (n_pf > 0) == (" PF=0" not in x), x
        else:
            assert (n_pf > 0) == (x.split()[3] in ("verify", "route_score")), x
    # no launch spills: a merge of many splits is spread over more warps
    assert not any(x.split("REG/STACK/SHARED ")[1].split("/")[1] != "0" and "dense" in x for x in lines)


@pytest.mark.skipif(not os.path.exists(PTXAS), reason="triton's bundled ptxas is not installed")
def test_draft_level_kernels_compile_for_sm90():
    """The draft level's fused kernels (two norms in one launch, with and without the parents' gather;
    the top-k over logits, norm folded), the drafter's ring commit, and the level's and the commit rows'
    attention with its merge (a branch's locals typed unlike the other's fails only here, not in the
    interpreter: session 47)."""
    r = _compile_script("compile_draft_sm90.py", 600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert len([x for x in r.stdout.splitlines() if " REG " in x]) == 8
