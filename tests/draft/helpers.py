"""Tiny random targets/heads and a brute-force sequential draft reference for the draft tests."""
from __future__ import annotations

import torch

from ssv.config import ModelConfig, RopeConfig
from ssv.draft.eagle3 import Eagle3Config, Eagle3Head, masked_attention
from ssv.model import Transformer


def tiny_target(vocab=80, layers=6, seed=0, head_dim=8) -> Transformer:
    """head_dim >= 16 for the Triton kernels on a GPU (tl.dot's smallest K)."""
    torch.manual_seed(seed)
    cfg = ModelConfig(vocab_size=vocab, hidden_size=4 * head_dim, intermediate_size=48, n_layers=layers, n_heads=4,
                      n_kv_heads=2, head_dim=head_dim, max_seq_len=512, rope=RopeConfig(theta=1000.0),
                      tie_embeddings=True, bos_token_id=1, eos_token_ids=(2,))
    m = Transformer(cfg)
    for p in m.parameters():
        torch.nn.init.normal_(p, std=0.3)
    return m.eval()


def tiny_head(target: Transformer, draft_vocab=None, window=512, seed=1) -> Eagle3Head:
    torch.manual_seed(seed)
    cfg = Eagle3Config.for_target(target.cfg, draft_vocab, window=window)
    head = Eagle3Head(cfg)
    for name, p in head.named_parameters():
        torch.nn.init.normal_(p, std=0.3 if p.dim() > 1 else 0.1)
        if p.dim() == 1:
            p.data += 1.0
    if draft_vocab and draft_vocab < cfg.vocab_size:
        ids = torch.randperm(cfg.vocab_size)[:draft_vocab]
        head.set_vocab(ids)
    return head.eval()


@torch.no_grad()
def brute_logp(head: Eagle3Head, embed, feats: torch.Tensor, toks: torch.Tensor, chain=()):
    """Run the head row by row from scratch over committed rows (fc(feats[r]), toks[r]) at position r,
    then the chain rows (previous row's output, chain[j]) at positions n + j; returns the last row's
    target-vocab log-probs. Every row sees the earlier rows inside the window, nothing else."""
    W, mid = head.cfg.window, head.midlayer
    K, V, P = [], [], []
    out = None
    rows = [(None, int(t)) for t in toks] + [(None, int(t)) for t in chain]
    for r, (_, tok) in enumerate(rows):
        h = head.project(feats[r][None]) if r < len(toks) else out
        pos = torch.tensor([r])
        cos, sin = head.rope(pos)
        q, k, v = mid.qkv(embed(torch.tensor([tok])), h, cos, sin)
        K.append(k[0]), V.append(v[0]), P.append(r)
        vis = torch.tensor([[p > r - W for p in P]])
        out = mid.finish(masked_attention(q, torch.stack(K), torch.stack(V), vis), h)
    return head.target_logp(out)[0]
