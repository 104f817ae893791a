"""The q|k|v projection with RoPE and the cache writes in one launch (`linear_rope`) against its
plain-PyTorch twin (interpreter on the CPU, compiled on a GPU)."""
import json

import pytest
import torch

from ssv.model.layers import rope_cos_sin, rope_inv_freq
from ssv.config import RopeConfig
from ssv.ops.linear.naive import linear_rope_naive
from ssv.ops.linear.ops import linear_rope
from ssv.ops.linear.policy import LinearLaunch

from ..conftest import make_tiny_model
from .test_glue import eager_and_fused_layer
from .test_linear import _nan_view, _tol
from .test_nsa_kernels import CUDA, DEV, DTYPES

DT = DTYPES[0]
FORMS = {"policy": None, "16x16x32": LinearLaunch(16, 16, 32, 4, 2), "32x32x64": LinearLaunch(32, 32, 64, 4, 3)}


def _case(m, hq, hkv, d, k, cos_form, seed, length=40):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(m, k, generator=g) * torch.rand(m, 1, generator=g) * 8).to(DT).to(DEV)
    w = (torch.randn((hq + 2 * hkv) * d, k, generator=g) / k ** 0.5).to(DT).to(DEV)
    pos_rows = torch.randint(0, 500, (m,), generator=g)
    inv = rope_inv_freq(d, RopeConfig(theta=10000.0))
    pos = None
    if cos_form == "rows":
        cos, sin = rope_cos_sin(pos_rows, inv)
    elif cos_form == "shared":
        cos, sin = rope_cos_sin(pos_rows[:1], inv)
    else:   # a table by position, rows read at pos
        cos, sin = rope_cos_sin(torch.arange(512), inv)
        pos = pos_rows.to(DEV)
    slots = torch.randperm(length, generator=g)[:m].to(DEV)
    return x, w, cos.to(DEV), sin.to(DEV), pos, slots


def _caches(hkv, length, d):
    # NaN-filled: every slot the call does not write must stay NaN, every one it writes must not
    return (torch.full((hkv, length, d), float("nan"), dtype=DT, device=DEV),
            torch.full((hkv, length, d), float("nan"), dtype=DT, device=DEV))


SHAPES = [(1, 3, 1, 32, 40), (5, 4, 2, 32, 72), (17, 6, 2, 64, 130), (48, 9, 3, 64, 576)]   # (M, Hq, Hkv, D, K)


@pytest.mark.parametrize("form,m,hq,hkv,d,k", [(f, *s) for f in FORMS for s in SHAPES
                                               if FORMS[f] is None or (s[3] // 2) % FORMS[f].bn == 0])
@pytest.mark.parametrize("norm,cos_form", [(False, "rows"), (True, "pos"), (True, "shared")])
def test_linear_rope_matches_naive_and_writes_only_its_slots(form, m, hq, hkv, d, k, norm, cos_form):
    lp = FORMS[form]
    x, w, cos, sin, pos, slots = _case(m, hq, hkv, d, k, cos_form, m * 100 + d + k, length=64)
    eps = 1e-5 if norm else None
    kw, vw = _caches(hkv, 64, d)
    want = linear_rope_naive(x, w, cos, sin, hq, hkv, kw, vw, slots, norm_eps=eps, pos=pos)
    _, xv = _nan_view(x)     # inputs inside NaN-filled buffers: loads past K must be masked
    _, wv = _nan_view(w)
    kc, vc = _caches(hkv, 64, d)
    got = linear_rope(xv, wv, cos, sin, hq, hkv, kc, vc, slots, norm_eps=eps, pos=pos, launch=lp)
    assert got.shape == (m, hq, d) and not got.isnan().any()
    torch.testing.assert_close(got, want, **_tol(k))
    written = torch.zeros(64, dtype=torch.bool)
    written[slots.cpu()] = True
    for c, cw in ((kc, kw), (vc, vw)):
        assert not c[:, written.to(DEV)].isnan().any() and c[:, ~written.to(DEV)].isnan().all()
        torch.testing.assert_close(c[:, written.to(DEV)], cw[:, written.to(DEV)], **_tol(k))


def test_linear_rope_is_linear_then_rope_write():
    """One launch, the same result as the q|k|v GEMM and rope_write's RoPE and stores, up to the
    product's rounding between them (fp32 here: none)."""
    from ssv.ops.glue.ops import rope_write
    from ssv.ops.linear.ops import linear
    x, w, cos, sin, pos, slots = _case(6, 4, 2, 32, 64, "pos", 5)
    k1, v1 = _caches(2, 40, 32)
    k2, v2 = _caches(2, 40, 32)
    lp = LinearLaunch(16, 16, 32, 4, 2)
    q1 = linear_rope(x, w, cos, sin, 4, 2, k1, v1, slots, norm_eps=1e-5, pos=pos, launch=lp)
    q2 = rope_write(linear(x, w, norm_eps=1e-5, launch=lp), cos, sin, 4, 2, k2, v2, slots, pos=pos)
    tol = dict(rtol=0, atol=0) if DT == torch.float32 and not CUDA else dict(rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(q1, q2, **tol)
    torch.testing.assert_close(k1[:, slots], k2[:, slots], **tol)
    torch.testing.assert_close(v1[:, slots], v2[:, slots], **tol)


def test_linear_rope_16_row_programs_give_each_row_the_one_row_result_bitwise():
    """Batch invariance (a verify pass at the AR step's tiles): row i of a 48-row call is the 1-row call."""
    x, w, cos, sin, pos, slots = _case(48, 3, 1, 32, 48, "pos", 9, length=64)
    lp = LinearLaunch(16, 16, 16, 4, 2)
    kb, vb = _caches(1, 64, 32)
    big = linear_rope(x, w, cos, sin, 3, 1, kb, vb, slots, norm_eps=1e-5, pos=pos, launch=lp)
    for i in (0, 17, 47):
        ko, vo = _caches(1, 64, 32)
        one = linear_rope(x[i:i + 1], w, cos, sin, 3, 1, ko, vo, slots[i:i + 1], norm_eps=1e-5, pos=pos[i:i + 1],
                          launch=lp)
        assert torch.equal(big[i:i + 1], one), i
        assert torch.equal(kb[:, slots[i]], ko[:, slots[i]]) and torch.equal(vb[:, slots[i]], vo[:, slots[i]])


def test_linear_rope_refuses_bad_shapes():
    x, w, cos, sin, pos, slots = _case(2, 2, 1, 32, 16, "rows", 1)
    kc, vc = _caches(1, 40, 32)
    with pytest.raises(ValueError, match="w must have"):
        linear_rope(x, w[:-1], cos, sin, 2, 1, kc, vc, slots)
    with pytest.raises(ValueError, match="D a power of two >= 32"):
        linear_rope(x, w[:4 * 16], cos[:, :16], sin[:, :16], 2, 1, kc[..., :16], vc[..., :16], slots)
    with pytest.raises(ValueError, match="caches"):
        linear_rope(x, w, cos, sin, 2, 1, kc, vc[:, :20], slots)
    with pytest.raises(ValueError, match="slots"):
        linear_rope(x, w, cos, sin, 2, 1, kc, vc, slots[:1])
    with pytest.raises(ValueError, match="cos / sin"):
        linear_rope(x, w, cos[:1].expand(3, -1), sin[:1].expand(3, -1), 2, 1, kc, vc, slots)
    with pytest.raises(ValueError, match="pos must be"):
        linear_rope(x, w, cos, sin, 2, 1, kc, vc, slots, pos=torch.zeros(3, dtype=torch.long, device=DEV))
    with pytest.raises(ValueError, match="column tile"):
        linear_rope(x, w, cos, sin, 2, 1, kc, vc, slots, launch=LinearLaunch(16, 32, 16, 4, 2))


def test_fused_block_with_the_rope_entry_equals_eager(tmp_path, monkeypatch):
    """A layer whose table lists the q|k|v projection with RoPE for this device: one linear_rope launch
    and no rope_write, against the eager layer (cache writes included)."""
    import ssv.model.layers as layers
    import ssv.ops.glue.ops as glue
    import ssv.ops.linear.policy as policy
    from ssv.ops.utils import device_name
    model = make_tiny_model(0, head_dim=32, hidden=64, n_heads=4, n_kv_heads=2).to(DEV)
    if DT != torch.float32:
        model = model.to(DT)
    c = model.cfg
    n = 5
    key = policy.gemm_key(n, (c.n_heads + 2 * c.n_kv_heads) * c.head_dim, c.hidden_size, False, True, False, rope=True)
    path = tmp_path / "tiles.json"
    path.write_text(json.dumps({device_name(torch.device(DEV)): {key: dict(bn=16, bk=16, warps=4, stages=2)}}))
    monkeypatch.setattr(policy, "TILES", path)
    layer = model.layers[1]
    with torch.no_grad():
        layer.input_layernorm.weight.uniform_(0.5, 1.5)
    called = []
    real_rw = glue.rope_write
    monkeypatch.setattr(glue, "rope_write", lambda *a, **kw: called.append("rope_write") or real_rw(*a, **kw))
    # the prefill (fused on CUDA, other row tiles) may call rope_write: only the layer's call counts
    outs = eager_and_fused_layer(model, n, before=called.clear)
    x = torch.zeros(n, c.hidden_size, device=DEV, dtype=DT)
    assert called == [] and layers.tuned_linear(x, torch.zeros(256, 64, device=DEV), norm=True, rope=True) is not None
    for a, b in zip(*outs):
        if DT == torch.float32:
            torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)
        else:   # the eager layer rounds q|k|v before RoPE, this one after: where RoPE cancels (the
            # tiny model's keys are large, qk_gain 4) one element differed by 0.024 at 0.19 (H200)
            assert not b.isnan().any() and ((b.float() - a.float()).norm() / a.float().norm()).item() < 1e-2


@pytest.mark.cuda
@pytest.mark.skipif(not CUDA, reason="a CUDA graph")
def test_linear_rope_in_a_graph_with_pdl_equals_eager():
    x, w, cos, sin, pos, slots = _case(48, 9, 3, 64, 576, "pos", 3, length=64)
    outs = []
    for graphed in (False, True):
        kc, vc = _caches(3, 64, 64)
        if not graphed:
            q = linear_rope(x, w, cos, sin, 9, 3, kc, vc, slots, norm_eps=1e-5, pos=pos, pdl=False)
        else:
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                for _ in range(2):   # the second waits on the first (PDL on Hopper)
                    q = linear_rope(x, w, cos, sin, 9, 3, kc, vc, slots, norm_eps=1e-5, pos=pos)
            kc.fill_(float("nan"))
            vc.fill_(float("nan"))
            g.replay()
            torch.cuda.synchronize()
        outs.append((q.clone(), kc.clone(), vc.clone()))
    for a, b in zip(*outs):
        assert torch.equal(a.nan_to_num(7.0), b.nan_to_num(7.0))


@pytest.mark.cuda
@pytest.mark.skipif(not CUDA, reason="the shipped tiles are compiled for a GPU")
def test_every_shipped_rope_tile_of_this_device_matches_naive():
    """Each q|k|v-with-RoPE entry the table lists for this GPU (the default model: 9 query heads, 3 KV
    heads of 64), at its tiles, against the twin at the M its row tile covers."""
    from ssv.ops.linear.policy import TILES, tuned_launch
    from ssv.ops.utils import device_name
    name = device_name(torch.device(DEV))
    keys = [k for k in json.loads(TILES.read_text()).get(name, {}) if k.endswith("-rope")]
    if not keys:
        pytest.skip(f"the table lists no q|k|v with RoPE for {name}")
    for key in keys:
        parts = key.split("-")
        tile, n, k = int(parts[0][2:]), int(parts[1][1:]), int(parts[2][1:])
        assert n == 15 * 64, key
        m = 1 if tile == 16 else tile * 3 // 4
        lp = tuned_launch(name, m, n, k, norm="norm" in parts, rope=True, path=TILES)
        x, w, cos, sin, pos, slots = _case(m, 9, 3, 64, k, "pos", n + k, length=64)
        eps = 1e-5 if "norm" in parts else None
        kw, vw = _caches(3, 64, 64)
        want = linear_rope_naive(x, w, cos, sin, 9, 3, kw, vw, slots, norm_eps=eps, pos=pos)
        kc, vc = _caches(3, 64, 64)
        got = linear_rope(x, w, cos, sin, 9, 3, kc, vc, slots, norm_eps=eps, pos=pos, launch=lp)
        torch.testing.assert_close(got, want, **_tol(k), msg=key)
        torch.testing.assert_close(kc[:, slots], kw[:, slots], **_tol(k), msg=key)
        torch.testing.assert_close(vc[:, slots], vw[:, slots], **_tol(k), msg=key)
