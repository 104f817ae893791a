"""The draft attention under Triton's interpreter (TRITON_INTERPRET=1, the CPU) in fp32 and in bf16 against
its fp32 twin, at the default head's level shape (8 nodes, 9 / 3 heads of 64, a full 512-key ring, level 4):
the largest absolute error of each. The CPU tests run fp32 (DTYPES[0]); this shows why no bf16 case runs there.
    TRITON_INTERPRET=1 PYTHONPATH=. python scripts/interp_bf16_draft_attn.py"""
import torch

from ssv.ops.draft_attn.naive import draft_attn_naive
from ssv.ops.draft_attn.ops import draft_attn

g = torch.Generator().manual_seed(0)
F, HQ, HKV, D, W, DEPTH, LEVEL, DLEN = 8, 9, 3, 64, 512, 6, 4, 4100
q = torch.randn(F, HQ, D, generator=g)
kr, vr = (torch.randn(W + 1, HKV, D, generator=g) for _ in range(2))
ks, vs = (torch.randn((DEPTH - 1) * F, HKV, D, generator=g) for _ in range(2))
dlen = torch.tensor([DLEN])
ring = torch.full((W + 1,), -1, dtype=torch.long)
p = torch.arange(DLEN - W, DLEN)
ring[p % W] = p
path = torch.full((F, DEPTH), -1, dtype=torch.long)
for j in range(LEVEL - 2):
    path[:, j] = j * F + torch.randint(0, F, (F,), generator=g)
path[:, LEVEL - 2] = (LEVEL - 2) * F + torch.arange(F)
want = draft_attn_naive(q, kr, vr, ring, ks, vs, path, dlen, LEVEL, W)
for dt in (torch.float32, torch.bfloat16):
    got = draft_attn(*(t.to(dt) for t in (q, kr, vr)), ring, ks.to(dt), vs.to(dt), path, dlen, LEVEL, W)
    print(f"{str(dt):15s} max |error| {(got.float() - want).abs().max().item():.3g}")
