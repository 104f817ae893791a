"""The small-M linear kernel against its plain-PyTorch twin (interpreter on the CPU, compiled on a GPU)."""
import pytest
import torch

from ssv.ops.linear.naive import linear_naive
from ssv.ops.linear.ops import linear
from ssv.ops.linear.policy import MAX_ROWS, LinearLaunch, default_launch, gemm_key, tiles_measured, tuned_launch

from .test_nsa_kernels import CUDA, DEV, DTYPES

DT = DTYPES[0]


def _tol(k: int) -> dict:
    # fp32: summation order over K; bf16 / fp16: one rounding of the result (METHOD.md's bf16 bound)
    return dict(rtol=1e-4, atol=1e-4 * k ** 0.5) if DT == torch.float32 else dict(rtol=2e-2, atol=2e-2)


def _case(m, n, k, glu, seed):
    g = torch.Generator().manual_seed(seed)
    # rows of very different scales (an un-normalized residual stream), weights at ~1/sqrt(K)
    x = (torch.randn(m, k, generator=g) * torch.rand(m, 1, generator=g) * 8).to(DT).to(DEV)
    w = (torch.randn(2 * n if glu else n, k, generator=g) / k ** 0.5).to(DT).to(DEV)
    res = torch.randn(m, n, generator=g).to(DT).to(DEV)
    return x, w, res


def _nan_view(t: torch.Tensor, rows: int = 0, cols: int = 5) -> tuple:
    """t's values in a [rows:rows + R, 2:2 + C] window of a NaN-filled larger buffer (strided rows):
    a read past a tail mask, or a write past one, meets or leaves NaN."""
    buf = torch.full((t.shape[0] + 2 * rows, t.shape[1] + cols), float("nan"), dtype=t.dtype, device=t.device)
    view = buf[rows:rows + t.shape[0], 2:2 + t.shape[1]]
    view.copy_(t)
    return buf, view


FORMS = {   # launch forms: the policy's, and forced ones that cross every tile edge
    "policy": None,
    "16x16x32": LinearLaunch(16, 16, 32, 4, 2),
    "32x64x64": LinearLaunch(32, 64, 64, 4, 3),
}


@pytest.mark.parametrize("form", list(FORMS))
@pytest.mark.parametrize("m,n,k", [(2, 24, 8), (1, 24, 40), (1, 100, 200), (3, 100, 72), (17, 33, 130), (40, 96, 576)])
@pytest.mark.parametrize("glu,norm,acc", [(False, False, False), (False, True, False), (False, False, True),
                                          (True, True, False), (True, False, True)])
def test_linear_matches_naive(form, m, n, k, glu, norm, acc):
    x, w, res = _case(m, n, k, glu, m * 1000 + n + k)
    eps = 1e-5 if norm else None
    want = linear_naive(x, w, out=res.clone() if acc else None, accumulate=acc, norm_eps=eps, glu=glu)
    # inputs as windows of NaN-filled buffers (every load past K or N must be masked), the output a
    # window with NaN rows and columns around it: every element of the window is written (or read
    # and written when accumulating), nothing beside it
    _, xv = _nan_view(x)
    _, wv = _nan_view(w)
    buf, out = _nan_view(res if acc else torch.full_like(res, float("nan")), rows=2, cols=7)
    got = linear(xv, wv, out=out, accumulate=acc, norm_eps=eps, glu=glu, launch=FORMS[form])
    assert got.data_ptr() == out.data_ptr()
    outside = torch.ones_like(buf, dtype=torch.bool)
    outside[2:2 + m, 2:2 + n] = False
    assert buf[outside].isnan().all()
    torch.testing.assert_close(got, want, **_tol(k))


@pytest.mark.parametrize("form", ["policy", "16x16x32"])
@pytest.mark.parametrize("m,n,k", [(1, 24, 40), (17, 33, 130)])
@pytest.mark.parametrize("acc", [False, True])
def test_linear_out2_receives_the_same_values(form, m, n, k, acc):
    """out2: the result's copy from the same launch, into a window of a NaN-filled buffer (every element
    of it written, nothing beside it), bitwise equal to out; out unchanged by giving it."""
    x, w, res = _case(m, n, k, False, m + n + k + acc)
    want = linear(x, w, out=res.clone() if acc else None, accumulate=acc, launch=FORMS[form])
    buf, tap = _nan_view(torch.full_like(res, float("nan")), rows=1, cols=3)
    got = linear(x, w, out=res.clone() if acc else None, accumulate=acc, launch=FORMS[form], out2=tap)
    assert torch.equal(got, want) and torch.equal(tap, want)
    outside = torch.ones_like(buf, dtype=torch.bool)
    outside[1:1 + m, 2:2 + n] = False
    assert buf[outside].isnan().all()
    with pytest.raises(ValueError, match="out2"):
        linear(x, w, out2=torch.zeros(m, n + 1, device=DEV, dtype=DT))
    with pytest.raises(ValueError, match="out2"):
        linear(x, w, out2=torch.zeros(m, n, device=DEV, dtype=torch.float64))


def test_linear_norm_scales_by_the_rows_own_rms():
    """norm_eps: RMSNorm(x) @ W.T with the norm's weight folded into W (`fold_norm`)."""
    from ssv.ops.glue.naive import fold_norm, rmsnorm_naive
    x, w, _ = _case(5, 48, 96, False, 3)
    gw = (1 + 0.2 * torch.randn(96, generator=torch.Generator().manual_seed(1))).to(DT).to(DEV)
    want = (rmsnorm_naive(x.float(), gw.float(), 1e-5) @ w.float().T)
    torch.testing.assert_close(linear(x, fold_norm(w, gw), norm_eps=1e-5).float(), want, **_tol(96))


def test_linear_refuses_bad_shapes():
    x = torch.zeros(2, 8, device=DEV, dtype=DT)
    with pytest.raises(ValueError, match="linear: x must be"):
        linear(x, torch.zeros(4, 7, device=DEV, dtype=DT))
    with pytest.raises(ValueError, match="linear: glu"):
        linear(x, torch.zeros(5, 8, device=DEV, dtype=DT), glu=True)
    with pytest.raises(ValueError, match="accumulate"):
        linear(x, torch.zeros(4, 8, device=DEV, dtype=DT), accumulate=True)
    with pytest.raises(ValueError, match="linear: out"):
        linear(x, torch.zeros(4, 8, device=DEV, dtype=DT), out=torch.zeros(2, 5, device=DEV, dtype=DT))
    if not CUDA:
        with pytest.raises(ValueError, match="pdl"):
            linear(x, torch.zeros(4, 8, device=DEV, dtype=DT), pdl=True)
    with pytest.raises(ValueError, match="powers of two"):
        linear(x, torch.zeros(4, 8, device=DEV, dtype=DT), launch=LinearLaunch(8, 16, 64, 4, 2))


def test_tuned_table_picks_listed_gemms_only(tmp_path):
    """A GEMM takes the kernel only where the table lists it for this device, keyed by its row tile
    and epilogue; everything else (other devices, shapes, flags, M past one verify tile) is cuBLAS."""
    import json
    path = tmp_path / "tiles.json"
    key = gemm_key(1, 576, 1536, False, False, True)
    path.write_text(json.dumps({"GPU X": {key: dict(bn=32, bk=128, warps=4, stages=6), "_measured": "x"}}))
    lp = tuned_launch("GPU X", 1, 576, 1536, acc=True, path=path)
    assert lp == LinearLaunch(16, 32, 128, 4, 6)
    assert tuned_launch("GPU X", 9, 576, 1536, acc=True, path=path) == lp          # same row tile (16)
    assert tuned_launch("GPU X", 17, 576, 1536, acc=True, path=path) is None      # row tile 32: unlisted
    assert tuned_launch("GPU X", 1, 576, 1536, path=path) is None                 # no residual: another GEMM
    assert tuned_launch("GPU Y", 1, 576, 1536, acc=True, path=path) is None
    assert tuned_launch("GPU X", MAX_ROWS + 1, 576, 1536, acc=True, path=path) is None
    assert default_launch(1, 576).bm == 16 and default_launch(48, 576).bm == 64
    assert tiles_measured("GPU X", path=path) == "x"
    assert tiles_measured("GPU Y", path=path) is None     # benchmarks record it: GEMMs on cuBLAS there


def test_shipped_table_names_the_lent_gpus():
    """The GPUs the project measures on each have an entry (an H100 without one ran cuBLAS for
    sessions 31-39), dated and keyed exactly as torch names the device."""
    from ssv.ops.linear.policy import TILES
    for name in ("NVIDIA H200", "NVIDIA H100 80GB HBM3"):
        m = tiles_measured(name, path=TILES)
        assert m is not None and m[:4] == "2026", (name, m)


def test_shipped_table_lists_only_small_weights():
    """Every shipped entry is a GEMM of at most a verify tile of rows whose tiles were timed against
    cuBLAS and won, or runs the AR step's 16-row tiles over a larger M (batch-invariant, timed too)."""
    import json
    from ssv.ops.linear.policy import TILES
    table = json.loads(TILES.read_text()) if TILES.exists() else {}
    for device, entries in table.items():
        for key, e in entries.items():
            if key.startswith("_"):
                continue
            tile = int(key.split("-")[0][2:])
            assert tile <= MAX_ROWS and e["us"] > 0 and e["cublas_us"] > 0, (device, key)
            assert e["us"] < e["cublas_us"] or e.get("bm", tile) == 16 < tile, (device, key)


@pytest.mark.cuda
@pytest.mark.skipif(not CUDA, reason="the shipped tiles are compiled for a GPU")
def test_every_shipped_tile_of_this_device_matches_naive():
    """Each GEMM the table lists for this GPU, at its tiles (deep pipelines, wide K chunks, narrower
    row programs), against the fp32 twin at the M its row tile covers."""
    import json
    from ssv.ops.linear.policy import TILES, tuned_launch
    from ssv.ops.utils import device_name
    name = device_name(torch.device(DEV))
    entries = json.loads(TILES.read_text()).get(name, {}) if TILES.exists() else {}
    keys = [k for k in entries if not k.startswith("_") and not k.endswith("-rope")]   # rope: test_linear_rope.py
    if not keys:
        pytest.skip(f"the table lists nothing for {name}")
    for key in keys:
        parts = key.split("-")
        tile, n, k = int(parts[0][2:]), int(parts[1][1:]), int(parts[2][1:])
        glu, norm, acc = "glu" in parts, "norm" in parts, "acc" in parts
        m = 1 if tile == 16 else tile * 3 // 4   # an AR step's row; 48 of a 64-row verify tile
        lp = tuned_launch(name, m, n, k, glu, norm, acc, path=TILES)
        x, w, res = _case(m, n, k, glu, n + k)
        eps = 1e-5 if norm else None
        want = linear_naive(x, w, out=res.clone() if acc else None, accumulate=acc, norm_eps=eps, glu=glu)
        got = linear(x, w, out=res.clone() if acc else None, accumulate=acc, norm_eps=eps, glu=glu, launch=lp)
        torch.testing.assert_close(got, want, **_tol(k), msg=key)


@pytest.mark.cuda
@pytest.mark.skipif(not CUDA, reason="the SmolLM2 shapes compiled need a GPU")
@pytest.mark.parametrize("m", [1, 48])
def test_linear_at_the_default_models_shapes_and_in_a_graph(m):
    """Each GEMM of a SmolLM2 layer as the fused step runs it, eager and replayed from a CUDA graph."""
    shapes = [(960, 576, False, True, False), (576, 576, False, False, True), (1536, 576, True, True, False),
              (576, 1536, False, False, True)]
    for n, k, glu, norm, acc in shapes:
        x, w, res = _case(m, n, k, glu, n + k + m)
        eps = 1e-5 if norm else None
        want = linear_naive(x, w, out=res.clone() if acc else None, accumulate=acc, norm_eps=eps, glu=glu)
        out = res.clone()
        got = linear(x, w, out=out, accumulate=acc, norm_eps=eps, glu=glu, pdl=False)
        torch.testing.assert_close(got, want, **_tol(k))
        out.copy_(res)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            linear(x, w, out=out, accumulate=acc, norm_eps=eps, glu=glu)
        out.copy_(res)
        graph.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(out, got, rtol=0, atol=0)
        # programmatic dependent launch, three calls in a row in a graph (each waits for the one
        # before): the same result bit for bit
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(3):
                linear(x, w, out=out, accumulate=acc, norm_eps=eps, glu=glu, pdl=True)
        out.copy_(res)
        graph.replay()
        torch.cuda.synchronize()
        want3 = res.clone()
        for _ in range(3):   # plain launches: the reference
            linear(x, w, out=want3, accumulate=acc, norm_eps=eps, glu=glu, pdl=False)
        torch.testing.assert_close(out, want3, rtol=0, atol=0)


@pytest.mark.parametrize("glu,norm,acc", [(False, True, False), (True, True, False), (False, False, True)])
def test_16_row_programs_give_each_row_the_one_row_result_bitwise(glu, norm, acc):
    """Batch invariance: with 16-row programs, row i of a 48-row call equals the 1-row call on row i
    bit for bit (each program computes its rows alone, in the same order), the property that a
    verify pass needs to reproduce the AR step's GEMMs exactly (policy: an entry's "bm")."""
    x, w, res = _case(48, 40, 96, glu, 7)
    lp = LinearLaunch(16, 16, 32, 4, 3)
    eps = 1e-5 if norm else None
    big = linear(x, w, out=res.clone() if acc else None, accumulate=acc, norm_eps=eps, glu=glu, launch=lp)
    for i in (0, 15, 16, 31, 47):
        one = linear(x[i:i + 1], w, out=res[i:i + 1].clone() if acc else None, accumulate=acc, norm_eps=eps,
                     glu=glu, launch=lp)
        assert torch.equal(big[i:i + 1], one), i


def test_table_entry_may_narrow_the_row_tile(tmp_path):
    import json
    path = tmp_path / "tiles.json"
    key = gemm_key(48, 576, 1536, False, False, True)
    path.write_text(json.dumps({"GPU X": {key: dict(bm=16, bn=16, bk=256, warps=4, stages=4)}}))
    assert tuned_launch("GPU X", 48, 576, 1536, acc=True, path=path) == LinearLaunch(16, 16, 256, 4, 4)


def _probe_module():
    import ssv.bench.linear as mod
    return mod


def test_this_machines_table_is_read_over_the_shipped_one(tmp_path, monkeypatch):
    """`ssv bench linear --save` writes $SSV_CACHE/linear-tiles.json: a device it names takes its entry
    from there; every other device keeps the shipped one."""
    import json
    import ssv.ops.linear.policy as policy
    shipped = json.loads(policy.TILES.read_text())
    dev = sorted(shipped)[0]
    key = gemm_key(1, 576, 1536, False, False, True)
    monkeypatch.setenv("SSV_CACHE", str(tmp_path))
    (tmp_path / "linear-tiles.json").write_text(json.dumps(
        {"GPU X": {key: dict(bn=32, bk=128, warps=4, stages=6), "_measured": "mine"}, dev: {"_measured": "mine too"}}))
    policy._read_tables.cache_clear()
    try:
        assert policy.user_tiles_path() == tmp_path / "linear-tiles.json"
        assert tuned_launch("GPU X", 1, 576, 1536, acc=True) == LinearLaunch(16, 32, 128, 4, 6)
        assert tiles_measured("GPU X") == "mine" and tiles_measured(dev) == "mine too"
        assert tuned_launch(dev, 1, 576, 1536, acc=True) is None      # that device's entry replaced whole
        other = [d for d in shipped if d != dev]
        assert all(tiles_measured(d) == shipped[d]["_measured"] for d in other)
    finally:
        monkeypatch.undo()
        policy._read_tables.cache_clear()
    assert tiles_measured("GPU X") is None


def test_bench_linear_merges_by_gemm_and_needs_a_gpu(tmp_path):
    import json
    pl = _probe_module()
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"GPU X": {"a": {"bn": 16}, "b": {"bn": 16}, "_measured": "old"}, "GPU Y": {"c": {}}}))
    pl.merge_tiles(str(path), "GPU X", {"b": {"bn": 32}}, {"a", "b"}, "new")
    got = json.loads(path.read_text())
    assert got == {"GPU X": {"b": {"bn": 32}, "_measured": "new"}, "GPU Y": {"c": {}}}   # "a" timed, lost: dropped
    pl.merge_tiles(str(path), "GPU X", {}, {"z"}, "newer")
    assert json.loads(path.read_text())["GPU X"] == {"b": {"bn": 32}, "_measured": "newer"}  # untimed kept
    if not CUDA:
        from ssv.cli import main
        with pytest.raises(SystemExit):
            main(["bench", "linear", "--out", str(tmp_path)])


def test_probe_lists_the_fastest_matching_tile_only_past_the_margin():
    """`ssv bench linear`'s choice, which writes tiles.json: a tile that fails to compile or does
    not match the twin is never listed; the fastest matching one is, where it beats the baseline by 3%."""
    pl = _probe_module()
    a, b, c, d = (LinearLaunch(16, bn, 64, 4, s) for bn, s in ((16, 3), (16, 4), (32, 3), (32, 4)))
    times = {a: (True, 2.0), b: (True, 1.5), d: (False, 1.0)}

    def trial(lp):
        if lp == c:
            raise RuntimeError("out of shared memory")
        return times[lp]
    for base, listed in ((2.0, b), (1.52, None)):
        rows, best = [], {}
        got = pl.choose("x", "key", "ar", base, "cublas", [a, b, c, d], trial, rows, dict(m=1), best)
        assert (got is None) if listed is None else (got["bn"], got["stages"], got["us"]) == (16, 4, 1.5)
        assert [r.get("error") is not None for r in rows] == [False, False, True, False]


def test_probe_lists_only_the_ar_steps_tiles_under_the_batch_invariant_rule():
    """For a verify pass's M the probe lists the AR step's tiles at 16-row programs where they are no
    slower than the baseline, and never a faster tile that is not batch-invariant."""
    pl = _probe_module()
    fast = LinearLaunch(64, 16, 64, 4, 3)
    ar = dict(bn=32, bk=256, warps=4, stages=3)
    inv = LinearLaunch(16, 32, 256, 4, 3)
    for inv_us, listed in ((1.9, True), (2.1, False)):
        times = {fast: (True, 1.0), inv: (True, inv_us)}
        best = {}
        got = pl.choose("x", "key48", "key1", 2.0, "cublas", [fast], lambda lp: times[lp], [], dict(m=48), best,
                        invariant={"key1": ar, "_take": True})
        assert (got == pl.table_entry(inv, inv_us, 2.0)) if listed else (got is None and best == {})


def test_probe_adds_wide_tiles_only_for_large_weights():
    """The small model's GEMMs keep their grid; a Llama-size GEMM also gets the wide tiles (bk never past K),
    and every tile is one the kernel takes (powers of two >= 16, the row tile from M)."""
    pl = _probe_module()
    for m in (1, 48):
        small = pl.configs(m, False, 1536, 576)
        assert small == pl.configs(m, False)
        big = pl.configs(m, False, 4096, 14336)
        assert big[:4] == small[:4] and any(c.bn >= 64 and c.warps == 8 for c in big)
        assert len(pl.configs(m, True, 4096, 14336)) == 4
        assert all(c.bm == pl.row_tile(m) and c.bk <= 14336 and not c.bn & (c.bn - 1) for c in big)
    assert all(c.bk <= 256 for c in pl.configs(48, False, 16384, 256))


def test_probe_runs_every_gemm_and_the_rope_case(monkeypatch):
    """The probe end to end on this device with a fake clock (the interpreter on the CPU): every GEMM
    of the default model's layer and q|k|v with RoPE, every tile compiled, run and checked (on a GPU
    against its twin: the interpreter's bf16 results are not trusted, it is tested in fp32)."""
    pl = _probe_module()
    monkeypatch.setattr(pl, "_bench", lambda fn, layers: (fn(), 1.0)[1])   # a call, then a fixed time
    grid = pl.configs
    # one tile besides the default
    monkeypatch.setattr(pl, "configs", lambda m, quick, n=0, k=0: grid(m, quick, n, k)[-1:])
    rows, best = [], {}
    pl.run("smollm2-135m", 1, 1, True, rows, best, dev=DEV)
    pl.run_rope("smollm2-135m", 1, 1, True, rows, best, dev=DEV)
    tiles = [r for r in rows if r["impl"].startswith("triton")]
    assert {r["gemm"] for r in tiles} == {"qkv", "o", "gate_up", "down", "qkv_rope"}
    assert all("error" not in r and r["us"] == 1.0 for r in tiles), [r for r in tiles if "error" in r]
    if CUDA:
        assert all(r["matches"] for r in tiles)
    assert best == {}   # no tile beat the (equal) baseline by 3%
