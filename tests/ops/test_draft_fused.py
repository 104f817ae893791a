"""The drafter's fused device-round layer (glue kernels, one SDPA call) against its eager twin: the
same log-probs, features, scratch keys and committed rows (interpreter on the CPU, compiled on a GPU)."""
import pytest
import torch

from ssv.draft import Eagle3Drafter
from ssv.draft.eagle3 import masked_attention, masked_attention_fused
from ssv.spec.device import grow_tree
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


@pytest.mark.parametrize("window", [512, 3])
def test_fused_drafter_matches_eager(window):
    target = tiny_target().to(DEV, DT)
    head = tiny_head(target, draft_vocab=40, window=window)
    a, b = (Eagle3Drafter(head, target, fused=f) for f in (False, True))
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
            out.append(lp.float())
            return lp
        tree = grow_tree(expand, toks[-1], d.dlogp_buf, spec, ids=d.vocab_ids)
        seen[name] = (tree, out, d._scratch[2].float().clone())
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
