import pytest
import torch

from ssv.draft import Eagle3Drafter
from ssv.draft.ttt import ttt_forward
from ssv.spec.tree import TreeSpec

from .helpers import tiny_head, tiny_target

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _run(device, dtype):
    target = tiny_target().to(device=device, dtype=dtype)
    target.inv_freq = target.inv_freq.float()
    d = Eagle3Drafter(tiny_head(target, draft_vocab=50, window=6), target, chunk=4)
    g = torch.Generator().manual_seed(0)
    taps = [torch.randn(9, 32, generator=g) for _ in range(3)]
    toks = torch.randint(3, 80, (9,), generator=g)
    lp = d.commit(taps, toks)
    rec = {}
    tree = d.propose(int(toks[-1]), lp, TreeSpec(depth=4, top_k=3, total_tokens=12), record=rec)
    return lp.cpu(), tree, rec


def test_drafter_cuda_matches_cpu():
    lp_c, tree_c, rec_c = _run("cpu", torch.float32)
    lp_g, tree_g, rec_g = _run("cuda", torch.float32)
    torch.testing.assert_close(lp_g, lp_c, rtol=1e-3, atol=1e-3)
    assert torch.equal(tree_g.tokens.cpu(), tree_c.tokens) and torch.equal(tree_g.parents.cpu(), tree_c.parents)
    for k in rec_c:
        torch.testing.assert_close(rec_g[k], rec_c[k], rtol=1e-3, atol=1e-3)
    lp_b, tree_b, _ = _run("cuda", torch.bfloat16)         # bf16 runs end to end
    assert tree_b.n == 12 and torch.isfinite(lp_b).sum() == 50


def test_ttt_cuda_matches_cpu():
    target = tiny_target()
    head = tiny_head(target, draft_vocab=50, window=5)
    g = torch.Generator().manual_seed(1)
    args = (torch.randn(2, 12, 96, generator=g), torch.randint(3, 80, (2, 12), generator=g),
            torch.randn(2, 12, 80, generator=g), torch.ones(2, 12, dtype=torch.bool))
    cpu = ttt_forward(head, target.embed_tokens.weight, *args, steps=3)
    head_g, emb_g = head.cuda(), target.embed_tokens.weight.cuda()
    gpu = ttt_forward(head_g, emb_g, *[a.cuda() for a in args], steps=3)
    for a, b in zip(cpu["losses"], gpu["losses"]):
        assert abs(a - b) < 1e-3 * max(1.0, abs(a))


def test_train_draft_resumes_on_cuda(tmp_path, monkeypatch):
    """A run stopped on the GPU resumes there (the RNG states of the checkpoint must come back as CPU tensors)."""
    import ssv.loaders
    from ssv.draft.train import main
    from ssv.loaders import LoadedCheckpoint

    from .test_train import _CharTok, _sd

    target = tiny_target()
    monkeypatch.setattr(ssv.loaders, "load_checkpoint",
                        lambda spec, **kw: LoadedCheckpoint(target.cfg, _sd(target), _CharTok(), "tiny"))
    common = ["--run-dir", str(tmp_path / "run"), "--device", "cuda", "--num-prompts", "6", "--eval-prompts", "2",
              "--sources", "topics", "--max-prompt-tokens", "24", "--max-new-tokens", "8", "--gen-batch", "4",
              "--seq-len", "40", "--draft-vocab", "30", "--window", "16", "--ttt-steps", "2", "--epochs", "3",
              "--batch-tokens", "80", "--warmup", "1", "--save-every", "1", "--eval-every", "0", "--log-every", "1"]
    assert main(common + ["--max-steps", "2"]) == 0
    assert main(common + ["--max-steps", "4"]) == 0
    assert torch.load(tmp_path / "run" / "state.pt", weights_only=False, map_location="cpu")["step"] == 4
