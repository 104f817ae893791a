"""`ssv bench spec` with the head's draft log-probs at a temperature T (log_softmax(logits / T)): a
probe of whether the shipped head's confidence is calibrated for tree building (T = 1 is the head
as shipped). Deterministic top-k candidates keep sampled acceptance lossless at any T; only the
tree's shape changes.

    SSV_DRAFT_T=1.6 python scripts/probe_draft_temperature.py bench spec --model default ...
"""
import os
import sys

import torch

from ssv.cli import main
from ssv.draft import eagle3

T = float(os.environ["SSV_DRAFT_T"])


def draft_logp(self, hidden):
    return torch.log_softmax(self.draft_logits(hidden) / T, -1)


eagle3.Eagle3Head.draft_logp = draft_logp
sys.exit(main(sys.argv[1:]))
