"""The drafter's fused device-round layer (glue kernels, one SDPA call) against its eager twin: the
same log-probs, features, scratch keys and committed rows (interpreter on the CPU, compiled on a GPU)."""
import pytest
import torch

from ssv.draft import Eagle3Drafter
from ssv.draft.eagle3 import masked_attention, masked_attention_fused
from ssv.spec.device import Logits, grow_tree
from ssv.spec.tree import TreeSpec

from ..draft.helpers import tiny_head, tiny_target
from .test_nsa_kernels import DEV, DTYPES

DT = DTYPES[0]
TOL = dict(rtol=1e-4, atol=1e-4) if DT == torch.float32 else dict(rtol=3e-2, atol=1.5e-1)


@pytest.mark.parametrize("n,hq,hkv,m", [(1, 4, 2, 5), (7, 9, 3, 33), (16, 8, 8, 70)])
def test_masked_attention_fused_matches_naive(n, hq, hkv, m):
    g = torch.Generator().manual_seed(n + m)
    q, k, v = (torch.randn(r, h, 16, generator=g).to(DEV, DT) for r, h in ((n, hq), (m, hkv), (m, hkv)))
    vis = torch.rand(n, m, generator=g) < 0.4
    vis[torch.arange(n), torch.randint(0, m, (n,), generator=g)] = True     # every row sees a key
    vis = vis.to(DEV)
    torch.testing.assert_close(masked_attention_fused(q, k, v, vis).float(), masked_attention(q, k, v, vis), **TOL)


def _features(d: Eagle3Drafter, spec: TreeSpec) -> torch.Tensor:
    """The tree's node features in grow_tree's row layout (level t at rows (t - 2) * top_k ..): the
    fused drafter keeps odd levels in a second buffer."""
    s = d._scratch
    h = s[2].float().clone()
    if d.fused:
        f = spec.top_k
        for level in range(3, spec.depth + 1, 2):
            h[(level - 2) * f:(level - 1) * f] = s[3][(level - 2) * f:(level - 1) * f].float()
    return h


@pytest.mark.parametrize("window,table", [(512, False), (3, False), (512, True)])
def test_fused_drafter_matches_eager(window, table):
    """table: the fused drafter reads RoPE from a table by position (the device round's), sized to the
    drafted positions exactly (the tree's levels at 11..14, the device commit's rows at 11..15)."""
    target = tiny_target().to(DEV, DT)
    head = tiny_head(target, draft_vocab=40, window=window)
    a, b = (Eagle3Drafter(head, target, fused=f) for f in (False, True))
    if table:
        b.use_rope_table(16)
    g = torch.Generator().manual_seed(window)
    H = target.cfg.hidden_size
    taps = [torch.randn(11, H, generator=g).to(DEV, DT) for _ in range(3)]
    toks = torch.randint(3, target.cfg.vocab_size, (11,), generator=g).to(DEV)
    for d in (a, b):
        d.commit(taps, toks)
    spec = TreeSpec(depth=4, top_k=3, total_tokens=12)
    seen = {}
    for name, d in (("eager", a), ("fused", b)):
        out = []

        def expand(level, t, p, r, d=d, out=out):
            lp = d.expand_rows(level, t, p, r)
            assert isinstance(lp, Logits) == d.fused      # the fused level leaves log_softmax to the top-k
            out.append(lp.log_probs() if isinstance(lp, Logits) else lp.float())
            return lp
        tree = grow_tree(expand, toks[-1], d.dlogp_buf, spec, ids=d.vocab_ids)
        seen[name] = (tree, out, _features(d, spec))
    (ta, la, ha), (tb, lb, hb) = seen["eager"], seen["fused"]
    if DT == torch.float32:     # the same tree, hence the same expansions to compare
        assert torch.equal(ta.tokens, tb.tokens) and torch.equal(ta.parents, tb.parents)
        for x, y in zip(la, lb):
            torch.testing.assert_close(y, x, **TOL)
        torch.testing.assert_close(hb, ha, **TOL)
    else:
        torch.testing.assert_close(lb[0], la[0], **TOL)     # level 2 has the same inputs in any dtype
    # the device commit of 5 rows of which 3 are real
    t2 = [torch.randn(5, H, generator=g).to(DEV, DT) for _ in range(3)]
    k2 = torch.randint(3, target.cfg.vocab_size, (5,), generator=g).to(DEV)
    for d in (a, b):
        d.commit_rows(t2, k2, torch.tensor([3], device=DEV))
    torch.testing.assert_close(b.hid_buf.float(), a.hid_buf.float(), **TOL)
    torch.testing.assert_close(b.dlogp_buf, a.dlogp_buf, **TOL)
    W = a.window
    torch.testing.assert_close(b.k[:W].float(), a.k[:W].float(), **TOL)
    torch.testing.assert_close(b.v[:W].float(), a.v[:W].float(), **TOL)
    assert torch.equal(a.slot_pos, b.slot_pos) and int(a.dlen) == int(b.dlen)


@pytest.mark.parametrize("table", [False, True])
def test_finish_fused_matches_finish(table, tmp_path, monkeypatch):
    """The midlayer's second half, fused as the target layer's (residual copied once, o_proj and
    down_proj adding in place, the norm folded into gate|up), against `finish`: through cuBLAS and
    the SwiGLU launch, and where the tile table lists the three GEMMs through ssv/ops/linear (the
    calls counted). The residual is a broadcast row, as the root's children's; out a window of a
    NaN-framed scratch."""
    import json
    import ssv.model.layers as layers
    import ssv.ops.linear.policy as policy
    from ssv.ops.utils import device_name
    target = tiny_target().to(DEV, DT)
    mid = tiny_head(target, draft_vocab=40).to(DEV, DT).midlayer
    c = mid.c
    with torch.no_grad():
        mid.post_attention_layernorm.weight.uniform_(0.5, 1.5)
    h, hd, inter, n = c.hidden_size, c.num_attention_heads * c.head_dim, c.intermediate_size, 6
    calls = []
    if table:
        keys = [policy.gemm_key(n, h, hd, False, False, True), policy.gemm_key(n, inter, h, True, True, False),
                policy.gemm_key(n, h, inter, False, False, True)]
        path = tmp_path / "tiles.json"
        path.write_text(json.dumps({device_name(torch.device(DEV)): {k: dict(bn=16, bk=16, warps=4, stages=2)
                                                                      for k in keys}}))
        monkeypatch.setattr(policy, "TILES", path)
        real = layers.linear

        def counted(x, w, **kw):
            calls.append((w.shape[0], kw.get("glu", False), kw.get("norm_eps") is not None,
                          kw.get("accumulate", False)))
            return real(x, w, **kw)
        monkeypatch.setattr(layers, "linear", counted)
    g = torch.Generator().manual_seed(7)
    attn = torch.randn(n, hd, generator=g).to(DEV, DT)
    residual = torch.randn(1, h, generator=g).to(DEV, DT).expand(n, h)
    scratch = torch.full((n + 2, h), float("nan"), device=DEV, dtype=DT)
    with torch.no_grad():
        want = mid.finish(attn, residual)
        got = mid.finish_fused(attn, residual, out=scratch[1:n + 1])
    assert got.data_ptr() == scratch[1].data_ptr() and scratch[0].isnan().all() and scratch[-1].isnan().all()
    torch.testing.assert_close(got.float(), want.float(), **TOL)
    assert sorted(calls) == (sorted([(h, False, False, True), (2 * inter, True, True, False), (h, False, False, True)])
                             if table else [])


@pytest.mark.parametrize("table_pos", [False, True])
def test_qkv_write_through_linear_rope_matches_the_gemm_and_rope_write(table_pos, tmp_path, monkeypatch):
    """Where the tile table lists the drafter's q|k|v with RoPE (K = 2 H, no folded norm), `qkv_write` is one
    `linear_rope` launch: the same q, and the same k / v rows written at the slots (nothing else of the
    NaN-poisoned buffers touched), as cuBLAS (F.linear) and `rope_write`; cos / sin one shared row (a
    level) or tables by position (the commit's rows)."""
    import json
    import ssv.ops.linear.ops as lops
    import ssv.ops.linear.policy as policy
    from ssv.ops.utils import device_name
    target = tiny_target(head_dim=32).to(DEV, DT)
    mid = tiny_head(target).to(DEV, DT).midlayer
    c = mid.c
    h, d, hkv = c.hidden_size, c.head_dim, c.num_key_value_heads
    n = 5
    g = torch.Generator().manual_seed(3)
    tokens = torch.randint(0, target.cfg.vocab_size, (n,), generator=g).to(DEV)
    hidden = torch.randn(n, h, generator=g).to(DEV, DT)
    if table_pos:
        pos = torch.tensor([9, 3, 12, 0, 7], device=DEV)
        cos, sin = (torch.randn(16, d, generator=g).to(DEV) for _ in range(2))
    else:
        pos = None
        cos, sin = (torch.randn(1, d, generator=g).to(DEV) for _ in range(2))
    slots = torch.tensor([2, 6, 0, 9, 4], device=DEV)
    out = {}
    for listed in (False, True):
        if listed:
            key = policy.gemm_key(n, (c.num_attention_heads + 2 * hkv) * d, 2 * h, False, False, False, rope=True)
            path = tmp_path / "tiles.json"
            path.write_text(json.dumps({device_name(torch.device(DEV)): {key: dict(bn=16, bk=32, warps=4, stages=2)}}))
            monkeypatch.setattr(policy, "TILES", path)
            calls = []
            real = lops.linear_rope
            monkeypatch.setattr(lops, "linear_rope", lambda *a, **kw: calls.append(kw["launch"]) or real(*a, **kw))
        kb, vb = (torch.full((12, hkv, d), float("nan"), device=DEV, dtype=DT) for _ in range(2))
        with torch.no_grad():
            q = mid.qkv_write(target.embed_tokens.weight, tokens, hidden, cos, sin, kb, vb, slots, pos=pos)
        out[listed] = (q, kb, vb)
    assert len(calls) == 1 and calls[0].bn == 16
    (qa, ka, va), (qb, kb, vb) = out[False], out[True]
    torch.testing.assert_close(qb.float(), qa.float(), **TOL)
    for a, b in ((ka, kb), (va, vb)):
        assert torch.equal(a.isnan(), b.isnan()) and not b[slots].isnan().any()
        torch.testing.assert_close(b[slots].float(), a[slots].float(), **TOL)
