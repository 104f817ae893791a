"""Fused glue kernels against their plain-PyTorch twins (interpreter on the CPU, compiled on a GPU)."""
import pytest
import torch

from ssv.attention import StepMeta
from ssv.engine.runner import Runner
from ssv.ops.glue.naive import rmsnorm_naive, rmsnorm_pair_naive, rope_write_naive, swiglu_naive
from ssv.ops.glue.ops import rmsnorm, rmsnorm_pair, rope_write, swiglu

from ..conftest import make_tiny_model
from .test_nsa_kernels import DEV, DTYPES

DT = DTYPES[0]
TOL = dict(rtol=1e-5, atol=1e-5) if DT == torch.float32 else dict(rtol=2e-2, atol=2e-2)


def eager_and_fused_layer(model, n: int, before=None) -> list:
    """Layer 1 over n new tokens after a 17-token prefill, eager then fused (what CUDA runs): for each,
    its output and layer 1's cache rows, new ones included. before(): called just before each layer
    call (the prefill has run)."""
    from ssv.model.layers import rope_cos_sin
    layer, outs = model.layers[1], []
    for fused in (False, True):
        r = Runner(model, attention="dense", max_len=64, backend="reference")
        r.prefill(list(range(3, 20)))
        meta = StepMeta.chain(r.length, n, device=DEV)
        plan = r.plan(meta)
        x = model.embed_tokens(torch.arange(n, device=DEV) + 30)
        cos, sin = rope_cos_sin(meta.positions, model.inv_freq)
        if before is not None:
            before()
        with torch.no_grad():
            y = layer._forward_fused(x, cos, sin, plan, r.cache) if fused else layer._forward_eager(x, cos, sin, plan, r.cache)
        outs.append((y, r.cache.k[1, :, : r.length + n].clone(), r.cache.v[1, :, : r.length + n].clone()))
    return outs


@pytest.mark.parametrize("n,d", [(1, 64), (7, 48), (3, 576)])
def test_rmsnorm_matches_naive(n, d):
    g = torch.Generator().manual_seed(n * d)
    x = (torch.randn(n, d, generator=g) * 3).to(DT).to(DEV)
    w = (1 + 0.1 * torch.randn(d, generator=g)).to(DT).to(DEV)
    torch.testing.assert_close(rmsnorm(x, w, 1e-5), rmsnorm_naive(x, w, 1e-5), **TOL)


def test_rmsnorm_gathers_rows_into_a_column_range():
    """rows= normalises x[rows] (an embedding lookup folded in); out= writes a column range of a
    wider buffer and nothing else (the drafter's [N, 2H] input without a concatenation)."""
    g = torch.Generator().manual_seed(5)
    x = (torch.randn(30, 48, generator=g) * 3).to(DT).to(DEV)
    w = (1 + 0.1 * torch.randn(48, generator=g)).to(DT).to(DEV)
    rows = torch.tensor([7, 0, 29, 7], device=DEV)
    buf = torch.full((4, 96), float("nan"), dtype=DT, device=DEV)
    got = rmsnorm(x, w, 1e-5, out=buf[:, 48:], rows=rows)
    assert got.data_ptr() == buf[:, 48:].data_ptr() and buf[:, :48].isnan().all()
    torch.testing.assert_close(buf[:, 48:], rmsnorm_naive(x[rows], w, 1e-5), **TOL)
    # a broadcast row (stride 0) in, as the drafter's level-2 feature
    one = rmsnorm(x[3][None].expand(5, 48), w, 1e-5)
    torch.testing.assert_close(one, rmsnorm_naive(x[3:4], w, 1e-5).expand(5, 48), **TOL)
    with pytest.raises(ValueError, match="rmsnorm: out"):
        rmsnorm(x, w, 1e-5, out=buf[:, 48:])


@pytest.mark.parametrize("n,d,broadcast", [(1, 64, False), (5, 48, True), (8, 576, False), (3, 40, True)])
def test_rmsnorm_pair_matches_naive(n, d, broadcast):
    """Both halves in one launch: gathered embedding rows (repeated ids) with one weight and eps, the
    features (a broadcast row, as the drafter's level 2) with another; every element of a NaN-filled
    output written, and bad shapes refused."""
    g = torch.Generator().manual_seed(n * d)
    x1 = (torch.randn(50, d, generator=g) * 3).to(DT).to(DEV)
    x2 = (torch.randn(n, d, generator=g) * 0.2).to(DT).to(DEV)
    if broadcast:
        x2 = x2[:1].expand(n, d)
    w1, w2 = ((1 + 0.1 * torch.randn(d, generator=g)).to(DT).to(DEV) for _ in range(2))
    rows = torch.randint(0, 50, (n,), generator=g).to(DEV)
    rows[-1] = rows[0]
    out = torch.full((n, 2 * d), float("nan"), dtype=DT, device=DEV)
    got = rmsnorm_pair(x1, w1, 1e-5, rows, x2, w2, 1e-3, out)
    assert got.data_ptr() == out.data_ptr() and not out.isnan().any()
    torch.testing.assert_close(out, rmsnorm_pair_naive(x1, w1, 1e-5, rows, x2, w2, 1e-3), **TOL)
    with pytest.raises(ValueError, match="rmsnorm_pair: out"):
        rmsnorm_pair(x1, w1, 1e-5, rows, x2, w2, 1e-3, out[:, 1:])
    with pytest.raises(ValueError, match="rmsnorm_pair: x2"):
        rmsnorm_pair(x1, w1, 1e-5, rows[:-1], x2, w2, 1e-3, out[:-1])


@pytest.mark.parametrize("n,d,broadcast", [(1, 64, False), (6, 48, False), (8, 576, False), (4, 40, True)])
def test_rmsnorm_pair_gathers_and_copies_the_features(n, d, broadcast):
    """rows2: the feature half normalizes rows rows2 of a larger x2 (the draft level's parents,
    repeated), and raw receives those rows as they are (the layer's residual): into a window of a
    NaN-framed buffer, its other rows untouched; raw alone with a broadcast row (the drafter's level
    2). Against the twin, and an index off by one row fails."""
    g = torch.Generator().manual_seed(7 * n + d)
    x1 = (torch.randn(30, d, generator=g) * 3).to(DT).to(DEV)
    src = (torch.randn(2 * n + 3, d, generator=g) * 0.2).to(DT).to(DEV)
    w1, w2 = ((1 + 0.1 * torch.randn(d, generator=g)).to(DT).to(DEV) for _ in range(2))
    rows = torch.randint(0, 30, (n,), generator=g).to(DEV)
    if broadcast:
        x2, rows2, want_raw = src[2][None].expand(n, d), None, src[2][None].expand(n, d)
    else:
        rows2 = torch.randint(0, src.shape[0], (n,), generator=g).to(DEV)
        rows2[-1] = rows2[0]
        x2, want_raw = src, src[rows2]
    out = torch.full((n, 2 * d), float("nan"), dtype=DT, device=DEV)
    frame = torch.full((n + 4, d), float("nan"), dtype=DT, device=DEV)
    raw = frame[2:2 + n]
    rmsnorm_pair(x1, w1, 1e-5, rows, x2, w2, 1e-3, out, rows2=rows2, raw=raw)
    assert not out.isnan().any() and frame[:2].isnan().all() and frame[2 + n:].isnan().all()
    assert torch.equal(raw, want_raw)
    want = rmsnorm_pair_naive(x1, w1, 1e-5, rows, x2, w2, 1e-3, rows2=rows2)
    torch.testing.assert_close(out, want, **TOL)
    if rows2 is not None:
        off = rmsnorm_pair_naive(x1, w1, 1e-5, rows, x2, w2, 1e-3, rows2=(rows2 + 1) % src.shape[0])
        assert not torch.allclose(out[:, d:].float(), off[:, d:].float(), **TOL)
        with pytest.raises(ValueError, match="rmsnorm_pair: rows2"):
            rmsnorm_pair(x1, w1, 1e-5, rows, x2, w2, 1e-3, out, rows2=rows2[:-1])
    with pytest.raises(ValueError, match="rmsnorm_pair: raw"):
        rmsnorm_pair(x1, w1, 1e-5, rows, x2, w2, 1e-3, out, rows2=rows2, raw=frame[:n + 1])


def test_rope_write_with_one_shared_position():
    g = torch.Generator().manual_seed(9)
    n, hq, hkv, d = 3, 4, 2, 16
    qkv = torch.randn(n, (hq + 2 * hkv) * d, generator=g).to(DT).to(DEV)
    f = 37.0 / (10000 ** (torch.arange(0, d, 2).float() / d))
    cos, sin = torch.cat([f, f])[None].cos().to(DEV), torch.cat([f, f])[None].sin().to(DEV)
    slots = torch.tensor([4, 1, 6], device=DEV)
    caches = [torch.zeros((hkv, 8, d), dtype=DT, device=DEV) for _ in range(4)]
    q = rope_write(qkv, cos, sin, hq, hkv, caches[0], caches[1], slots)
    q_ref = rope_write_naive(qkv, cos.expand(n, d), sin.expand(n, d), hq, hkv, caches[2], caches[3], slots)
    torch.testing.assert_close(q, q_ref, **TOL)
    torch.testing.assert_close(caches[0], caches[2], **TOL)
    with pytest.raises(ValueError, match="rope_write: cos"):
        rope_write(qkv, cos.expand(2, d), sin.expand(2, d), hq, hkv, caches[0], caches[1], slots)


@pytest.mark.parametrize("n,dm", [(1, 0), (7, 48)])
def test_rope_write_reads_table_rows_by_position(n, dm):
    """cos / sin as tables and each row's position: the same bits as the rows handed over."""
    g = torch.Generator().manual_seed(n + dm)
    hq, hkv, d, P = 4, 2, 16, 300
    norm = _norm_input(n, dm, g)
    qkv = torch.randn(n, (hq + 2 * hkv) * d, generator=g).to(DT).to(DEV)
    inv = 1.0 / (10000 ** (torch.arange(0, d, 2).float() / d))
    f = torch.arange(P).float()[:, None] * inv[None]
    cos, sin = torch.cat([f, f], -1).cos().to(DEV), torch.cat([f, f], -1).sin().to(DEV)
    pos = torch.randint(0, P, (n,), generator=g).to(DEV)
    slots = torch.randperm(20, generator=g)[:n].to(DEV)
    caches = [torch.full((hkv, 20, d), float("nan"), dtype=DT, device=DEV) for _ in range(6)]
    q = rope_write(qkv, cos, sin, hq, hkv, caches[0], caches[1], slots, norm=norm, pos=pos)
    q_rows = rope_write(qkv, cos[pos], sin[pos], hq, hkv, caches[2], caches[3], slots, norm=norm)
    q_ref = rope_write_naive(qkv, cos, sin, hq, hkv, caches[4], caches[5], slots, norm=norm, pos=pos)
    assert torch.equal(q, q_rows)
    torch.testing.assert_close(q, q_ref, **TOL)
    for a, b in ((caches[0], caches[2]), (caches[1], caches[3])):
        assert torch.equal(a.nan_to_num(7.0), b.nan_to_num(7.0))
    with pytest.raises(ValueError, match="rope_write: pos"):
        rope_write(qkv, cos, sin, hq, hkv, caches[0], caches[1], slots, pos=pos[:1].expand(n + 1))


def _norm_input(n, dm, g):
    """An un-normalized layer input (rows of very different scales) and its eps, or None."""
    if not dm:
        return None
    return ((torch.randn(n, dm, generator=g) * torch.rand(n, 1, generator=g) * 20).to(DT).to(DEV), 1e-5)


@pytest.mark.parametrize("n,i,dm", [(1, 64, 0), (5, 100, 0), (2, 1536, 0), (3, 100, 48), (2, 1536, 576)])
def test_swiglu_matches_naive(n, i, dm):
    g = torch.Generator().manual_seed(i + dm)
    norm = _norm_input(n, dm, g)
    gu = torch.randn(n, 2 * i, generator=g) * (1 if norm is None else 20)   # projections of the raw rows
    gu = gu.to(DT).to(DEV)
    torch.testing.assert_close(swiglu(gu, norm=norm), swiglu_naive(gu, norm=norm), **TOL)


@pytest.mark.parametrize("n,hq,hkv,d,dm", [(1, 4, 2, 16, 0), (9, 9, 3, 64, 0), (4, 8, 8, 32, 0), (5, 9, 3, 64, 576),
                                           (2, 4, 2, 16, 40)])
def test_rope_write_matches_naive_and_touches_only_its_slots(n, hq, hkv, d, dm):
    """Also with a folded norm (dm: the layer input's width): rows scaled by the input's 1 / rms."""
    g = torch.Generator().manual_seed(n + d + dm)
    norm = _norm_input(n, dm, g)
    qkv = torch.randn(n, (hq + 2 * hkv) * d, generator=g).to(DT).to(DEV)
    pos = torch.randint(0, 500, (n,), generator=g)
    inv = 1.0 / (10000 ** (torch.arange(0, d, 2).float() / d))
    f = pos.float()[:, None] * inv[None]
    cos, sin = torch.cat([f, f], -1).cos().to(DEV), torch.cat([f, f], -1).sin().to(DEV)
    # a strided column of slots (the drafter hands one over)
    slots = torch.randperm(40, generator=g)[:2 * n].view(n, 2)[:, 1].to(DEV)
    caches = [torch.full((hkv, 40, d), float("nan"), dtype=DT, device=DEV) for _ in range(4)]
    q = rope_write(qkv, cos, sin, hq, hkv, caches[0], caches[1], slots, norm=norm)
    q_ref = rope_write_naive(qkv, cos, sin, hq, hkv, caches[2], caches[3], slots, norm=norm)
    torch.testing.assert_close(q, q_ref, **TOL)
    for got, want in ((caches[0], caches[2]), (caches[1], caches[3])):
        assert torch.equal(torch.isnan(got), torch.isnan(want))        # nothing written off the slots
        torch.testing.assert_close(got[:, slots], want[:, slots], **TOL)


def test_glue_refuses_bad_shapes():
    x = torch.zeros(2, 8, device=DEV, dtype=DT)
    with pytest.raises(ValueError, match="rmsnorm"):
        rmsnorm(x, torch.ones(7, device=DEV, dtype=DT), 1e-5)
    with pytest.raises(ValueError, match="swiglu"):
        swiglu(torch.zeros(2, 7, device=DEV, dtype=DT))
    with pytest.raises(ValueError, match="rope_write"):
        c = torch.zeros(1, 4, 4, device=DEV, dtype=DT)
        rope_write(torch.zeros(2, 11, device=DEV, dtype=DT), torch.zeros(2, 4, device=DEV),
                   torch.zeros(2, 4, device=DEV), 1, 1, c, c, torch.zeros(2, dtype=torch.long, device=DEV))
    with pytest.raises(ValueError, match="norm"):
        swiglu(torch.zeros(2, 8, device=DEV, dtype=DT), norm=(torch.zeros(3, 8, device=DEV, dtype=DT), 1e-5))


def test_folded_norm_equals_norm_then_projection():
    """fold_norm's identity on random weights: RMSNorm(x) @ W.T == rsqrt(mean(x^2)+eps) * x @ (W*g).T."""
    from ssv.ops.glue.naive import fold_norm, row_rsqrt
    g = torch.Generator().manual_seed(4)
    x, w, gw = torch.randn(6, 40, generator=g) * 5, torch.randn(24, 40, generator=g), torch.randn(40, generator=g)
    torch.testing.assert_close(row_rsqrt(x, 1e-5) * (x @ fold_norm(w, gw).T), rmsnorm_naive(x, gw, 1e-5) @ w.T,
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("attn_bias", [False, True])
def test_fused_block_equals_eager_block(attn_bias):
    """A layer through the fused glue (what CUDA runs) equals the eager layer, cache writes included."""
    model = make_tiny_model(0, attn_bias=attn_bias).to(DEV)
    if DT != torch.float32:
        model = model.to(DT)
    with torch.no_grad():
        for layer in model.layers:   # norm weights off 1: the folded norms must carry them
            layer.input_layernorm.weight.uniform_(0.5, 1.5)
            layer.post_attention_layernorm.weight.uniform_(0.5, 1.5)
        if attn_bias:
            for layer in model.layers:
                for p in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                    p.bias.normal_()
    outs = eager_and_fused_layer(model, 5)
    for a, b in zip(*outs):
        torch.testing.assert_close(b, a, **TOL)


def test_fused_model_forward_equals_eager_with_taps(monkeypatch):
    """The whole model through the fused layers (residuals added in place) against the eager layers:
    logits and every tapped hidden state (a tap must not see the next layer's in-place residual)."""
    import ssv.model.layers as layers
    import ssv.model.llama as llama
    model = make_tiny_model(2, n_layers=4).to(DEV)
    if DT != torch.float32:
        model = model.to(DT)
    with torch.no_grad():
        for layer in model.layers:
            layer.input_layernorm.weight.uniform_(0.5, 1.5)
            layer.post_attention_layernorm.weight.uniform_(0.5, 1.5)
    outs = []
    for fused in (False, True):
        flag = (lambda x: x.dim() == 2 and not torch.is_grad_enabled()) if fused else (lambda x: False)
        monkeypatch.setattr(layers, "fused_glue", flag)
        monkeypatch.setattr(llama, "fused_glue", flag)
        r = Runner(model, attention="dense", max_len=64, backend="reference")
        r.prefill(list(range(3, 20)))
        logits, taps = r.forward(torch.arange(5) + 30, StepMeta.chain(r.length, 5), taps=(0, 1, 3))
        outs.append([logits.float()] + [t.float() for t in taps])
    assert len(outs[1]) == 4
    for a, b in zip(*outs):
        if DT == torch.float32:
            torch.testing.assert_close(b, a, **TOL)
        else:   # 4 layers of bf16 roundings, in another order where the norms are folded (H200:
            # 1.5e-2 in one tap; a fold that drops the norm weights, uniform in [0.5, 1.5], is ~0.3)
            assert not b.isnan().any() and ((b - a).norm() / a.norm()).item() < 3e-2


def test_fused_forward_with_the_caches_rope_table_is_bitwise_the_computed_rows(monkeypatch):
    """The Runner's RoPE table (CUDA) read by position in the fused layers: the same logits and cache
    rows, bit for bit, as cos / sin computed for the step's positions (a tree's, not a chain's)."""
    import ssv.model.layers as layers
    import ssv.model.llama as llama
    flag = lambda x: x.dim() == 2 and not torch.is_grad_enabled()   # noqa: E731
    monkeypatch.setattr(layers, "fused_glue", flag)
    monkeypatch.setattr(llama, "fused_glue", flag)
    model = make_tiny_model(4, n_layers=3).to(DEV)
    if DT != torch.float32:
        model = model.to(DT)
    outs = []
    for table in (False, True):
        r = Runner(model, attention="dense", max_len=64, backend="reference")
        r.cache.rope = model.rope_table(64 + r.scratch) if table else None
        r.prefill(list(range(3, 20)))
        pos = torch.tensor([17, 18, 18, 19, 20])
        mask = torch.tensor([[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 0, 1, 0, 0], [1, 1, 0, 1, 0], [1, 1, 0, 1, 1]]).bool()
        logits, _ = r.forward(torch.arange(5) + 30, StepMeta(r.length, pos, mask))
        outs.append((logits, r.cache.k[:, :, :r.length + 5].clone(), r.cache.v[:, :, :r.length + 5].clone()))
    assert (outs[1][0] != 0).any()
    for a, b in zip(*outs):
        assert torch.equal(a, b)


def test_fused_block_with_the_linear_kernel_equals_eager(tmp_path, monkeypatch):
    """The fused layer where the tile table lists its GEMMs for this device: q|k|v with the norm's row
    scale, o_proj and down_proj adding the residual, gate|up ending in SwiGLU, all through
    ssv/ops/linear, against the eager layer (cache writes included)."""
    import json
    import ssv.ops.linear.policy as policy
    from ssv.ops.utils import device_name
    model = make_tiny_model(0).to(DEV)
    if DT != torch.float32:
        model = model.to(DT)
    c = model.cfg
    h, q = c.hidden_size, (c.n_heads + 2 * c.n_kv_heads) * c.head_dim
    n = 5
    tile = dict(bn=16, bk=16, warps=4, stages=2)
    keys = [policy.gemm_key(n, q, h, False, True, False), policy.gemm_key(n, h, c.n_heads * c.head_dim, False, False, True),
            policy.gemm_key(n, c.intermediate_size, h, True, True, False),
            policy.gemm_key(n, h, c.intermediate_size, False, False, True)]
    path = tmp_path / "tiles.json"
    path.write_text(json.dumps({device_name(torch.device(DEV)): {k: tile for k in keys}}))
    monkeypatch.setattr(policy, "TILES", path)
    from ssv.model.layers import tuned_linear
    layer = model.layers[1]
    with torch.no_grad():
        layer.input_layernorm.weight.uniform_(0.5, 1.5)
        layer.post_attention_layernorm.weight.uniform_(0.5, 1.5)
    x0 = torch.zeros(n, h, device=DEV, dtype=DT)
    assert tuned_linear(x0, layer.mlp.down_proj.weight, acc=True) is not None
    import ssv.model.layers as layers
    calls = []
    real = layers.linear

    def counted(x, w, **kw):
        calls.append((w.shape[0], kw.get("glu", False), kw.get("norm_eps") is not None, kw.get("accumulate", False)))
        return real(x, w, **kw)
    monkeypatch.setattr(layers, "linear", counted)
    outs = eager_and_fused_layer(model, n)
    # the fused pass took the kernel for all four GEMMs (q|k|v with the norm, o_proj + residual,
    # gate|up with the norm and SwiGLU, down_proj + residual)
    assert sorted(calls) == sorted([(q, False, True, False), (h, False, False, True),
                                    (2 * c.intermediate_size, True, True, False), (h, False, False, True)])
    for a, b in zip(*outs):
        torch.testing.assert_close(b, a, **TOL)
