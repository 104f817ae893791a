import pytest
import torch

from ssv.draft.ttt import ttt_forward

from .helpers import brute_logp, tiny_head, tiny_target


@pytest.mark.parametrize("window", [512, 4])
def test_ttt_steps_equal_inference_chains(window):
    """Unrolled step k of row t == the drafter's depth-k chain node rooted at committed row t."""
    target = tiny_target()
    head = tiny_head(target, draft_vocab=50, window=window)
    T, H = 10, target.cfg.hidden_size
    g = torch.Generator().manual_seed(0)
    feats = torch.randn(1, T, 3 * H, generator=g)
    tokens = torch.randint(3, target.cfg.vocab_size, (1, T), generator=g)
    teacher = torch.randn(1, T, target.cfg.vocab_size, generator=g)
    valid = torch.ones(1, T, dtype=torch.bool)
    with torch.no_grad():
        res = ttt_forward(head, target.embed_tokens.weight, feats, tokens, teacher, valid, steps=3, keep_logits=True)
    x = tokens[0]
    for k, logits in enumerate(res["logits"]):
        for t in range(T - 1 - k):
            # committed rows r = 0..t hold (feat r, x[r+1]); chain tokens x[t+2 .. t+1+k]
            want = brute_logp(head, target.embed_tokens, feats[0, : t + 1], x[1 : t + 2], x[t + 2 : t + 2 + k].tolist())
            got = torch.log_softmax(logits[0, t], -1)
            torch.testing.assert_close(got, want[head.target_ids()], rtol=1e-4, atol=1e-4)


def test_ttt_loss_mask_and_targets():
    target = tiny_target()
    head = tiny_head(target, draft_vocab=30)
    T = 8
    feats = torch.randn(2, T, 3 * target.cfg.hidden_size)
    tokens = torch.randint(3, target.cfg.vocab_size, (2, T))
    teacher = torch.randn(2, T, target.cfg.vocab_size)
    valid = torch.zeros(2, T, dtype=torch.bool)
    res = ttt_forward(head, target.embed_tokens.weight, feats, tokens, teacher, valid, steps=2)
    assert res["counts"] == [0, 0] and float(res["loss"].detach()) == 0.0
    # teacher top-1 always inside the draft vocab -> every valid position counts
    ids = head.target_ids()
    teacher[..., ids[0]] = 100.0
    valid[:, 3:] = True
    res = ttt_forward(head, target.embed_tokens.weight, feats, tokens, teacher, valid, steps=2)
    # step k uses teacher positions t + 1 + k, for rows t >= 0: valid positions 3..7 seen from rows 2..6 / 1..5
    assert res["counts"] == [2 * 5, 2 * 5]
    res["loss"].backward()
    assert head.fc.weight.grad is not None and head.lm_head.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("T,window,steps", [(23, 5, 3), (16, 4, 2), (7, 16, 3), (9, 3, 4)])
def test_banded_attention_equals_dense(T, window, steps, monkeypatch):
    """Loss, per-step logits and gradients of the banded step-0 attention equal the dense masked
    form, at lengths that are and are not multiples of the window, windows longer than the
    sequence, and more steps than the window allows (rows left with their chain keys only)."""
    import ssv.draft.ttt as ttt

    from .ttt_dense_ref import attend_dense

    target = tiny_target()
    g = torch.Generator().manual_seed(T * 100 + window)
    B, H = 2, target.cfg.hidden_size
    feats = torch.randn(B, T, 3 * H, generator=g)
    tokens = torch.randint(3, target.cfg.vocab_size, (B, T), generator=g)
    teacher = torch.randn(B, T, target.cfg.vocab_size, generator=g)
    valid = torch.rand(B, T, generator=g) > 0.2
    outs = []
    for attend in (ttt._attend, attend_dense):
        monkeypatch.setattr(ttt, "_attend", attend)
        torch.manual_seed(0)
        head = tiny_head(target, draft_vocab=40, window=window)
        res = ttt.ttt_forward(head, target.embed_tokens.weight, feats, tokens, teacher, valid, steps=steps, keep_logits=True)
        res["loss"].backward()
        outs.append((res, {n: p.grad.clone() for n, p in head.named_parameters() if p.grad is not None}))
    (a, ga), (b, gb) = outs
    assert a["counts"] == b["counts"]
    for x, y in zip(a["logits"], b["logits"]):
        assert torch.isfinite(x).all()
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(a["loss"], b["loss"], rtol=1e-5, atol=1e-6)
    assert ga.keys() == gb.keys() and ga
    for n in ga:
        torch.testing.assert_close(ga[n], gb[n], rtol=1e-4, atol=1e-6)
