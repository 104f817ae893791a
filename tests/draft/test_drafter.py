import pytest
import torch

from ssv.draft import Eagle3Drafter
from ssv.spec.tree import TreeSpec

from .helpers import brute_logp, tiny_head, tiny_target


def _features(target, n, seed):
    g = torch.Generator().manual_seed(seed)
    taps = [torch.randn(n, target.cfg.hidden_size, generator=g) for _ in range(3)]
    toks = torch.randint(3, target.cfg.vocab_size, (n,), generator=g)
    return taps, toks


def _cat(drafter, taps):
    return torch.cat([taps[o] for o in drafter._order], -1)


@pytest.mark.parametrize("window,draft_vocab", [(512, None), (4, None), (3, 40)])
def test_tree_expansion_matches_brute_force(window, draft_vocab):
    target = tiny_target()
    head = tiny_head(target, draft_vocab=draft_vocab, window=window)
    d = Eagle3Drafter(head, target, chunk=5)
    taps, toks = _features(target, 11, 0)
    lp = d.commit(taps, toks)
    feats = _cat(d, taps)
    torch.testing.assert_close(lp, brute_logp(head, target.embed_tokens, feats, toks), rtol=1e-4, atol=1e-4)
    rec = {}
    tree = d.propose(int(toks[-1]), lp, TreeSpec(depth=5, top_k=3, total_tokens=20), record=rec)
    assert tree.n == 20 and len(rec) == 1 + 4 * 3
    for path, got in rec.items():
        want = brute_logp(head, target.embed_tokens, feats, toks, path)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        assert torch.isinf(got).sum() == (target.cfg.vocab_size - head.cfg.draft_vocab_size)


def test_commit_propose_cycles_match_recomputation():
    target = tiny_target()
    head = tiny_head(target, window=6)
    d = Eagle3Drafter(head, target, chunk=4)
    all_taps, all_toks = [], []
    for cycle, n in enumerate([9, 1, 3, 7, 2]):
        taps, toks = _features(target, n, 10 + cycle)
        all_taps.append(_cat(d, taps)), all_toks.append(toks)
        lp = d.commit(taps, toks)
        feats, tk = torch.cat(all_taps), torch.cat(all_toks)
        torch.testing.assert_close(lp, brute_logp(head, target.embed_tokens, feats, tk), rtol=1e-4, atol=1e-4)
        rec = {}
        d.propose(int(tk[-1]), None, TreeSpec(depth=3, top_k=2, total_tokens=6), record=rec)
        for path, got in rec.items():
            torch.testing.assert_close(got, brute_logp(head, target.embed_tokens, feats, tk, path),
                                       rtol=1e-4, atol=1e-4)
    assert d.length == 22
    d.reset()
    assert d.length == 0
    with pytest.raises(ValueError):
        d.propose(3, None, TreeSpec(depth=2, top_k=2, total_tokens=3))


def test_propose_is_deterministic_and_root_only():
    target = tiny_target()
    d = Eagle3Drafter(tiny_head(target), target)
    taps, toks = _features(target, 5, 3)
    lp = d.commit(taps, toks)
    spec = TreeSpec(depth=4, top_k=4, total_tokens=30)
    a, b = d.propose(7, lp, spec), d.propose(7, lp, spec)
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.parents, b.parents)
    assert int(a.tokens[0]) == 7
    assert d.propose(7, lp, TreeSpec(depth=4, top_k=4, total_tokens=1)).n == 1


def test_commit_checks():
    target = tiny_target()
    d = Eagle3Drafter(tiny_head(target), target)
    taps, toks = _features(target, 4, 0)
    with pytest.raises(ValueError):
        d.commit(taps[:2], toks)
    with pytest.raises(ValueError):
        d.commit(taps, toks[:3])
    with pytest.raises(ValueError):
        d.commit(taps, toks, start=5)
    d.commit(taps, toks, start=0)
    assert d.taps == tuple(sorted(d.taps))


def test_drafter_with_target_taps_end_to_end():
    """taps from the real Transformer forward (Runner) plug straight into commit."""
    from ssv.draft import join_prefill_taps
    from ssv.engine.runner import Runner

    target = tiny_target()
    d = Eagle3Drafter(tiny_head(target), target)
    r = Runner(target, attention="dense", max_len=64)
    ids = list(range(3, 23))
    logits, chunks = r.prefill(ids, chunk=8, taps=d.taps)
    taps = join_prefill_taps(chunks)
    root = int(torch.argmax(logits))
    lp = d.commit(taps, torch.tensor(ids[1:] + [root]))
    tree = d.propose(root, lp, TreeSpec(depth=3, top_k=2, total_tokens=5))
    assert tree.n == 5 and int(tree.tokens[0]) == root
