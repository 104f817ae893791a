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
