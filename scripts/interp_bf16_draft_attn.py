"""The draft attention under Triton's interpreter (TRITON_INTERPRET=1, the CPU) in fp32 and in bf16 against
its fp32 twin, at the default head's level shape (8 nodes, 9 / 3 heads of 64, a full 512-key ring, level 4):
the largest absolute error of each. The CPU tests run fp32 (DTYPES[0]); this shows why no bf16 case runs there.
    TRITON_INTERPRET=1 PYTHONPATH=. python scripts/interp_bf16_draft_attn.py"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from ssv.ops.draft_attn.naive import draft_attn_naive  # noqa: E402
from ssv.ops.draft_attn.ops import draft_attn  # noqa: E402
from tests.ops.test_draft_attn import _case  # noqa: E402  (the CPU tests' inputs, at the default level shape)

W, LEVEL = 512, 4
q, kr, vr, ring, ks, vs, path, dlen = _case(8, 9, 3, 64, W, 6, LEVEL, W, 4100, 0)
want = draft_attn_naive(q, kr, vr, ring, ks, vs, path, dlen, LEVEL, W)
for dt in (torch.float32, torch.bfloat16):
    got = draft_attn(*(t.to(dt) for t in (q, kr, vr)), ring, ks.to(dt), vs.to(dt), path, dlen, LEVEL, W)
    print(f"{str(dt):15s} max |error| {(got.float() - want).abs().max().item():.3g}")
