# Variants for scripts/cpu_step_ab.py (`llm` given): the draft head's GEMMs on the CPU in bf16 through oneDNN's packed
# bf16 weights (the head's own dtype; AVX512-BF16 here) against fp32. Session 55: draft 4.40 -> 3.93 ms, accept 4.04
# -> 3.21 (minima), ~1.3 ms of a ~50 ms round (2.6%): not taken (bench/NOTES.md, session 55).
import torch
import types
import torch.nn.functional as F
import ssv.draft.eagle3 as E
import ssv.model.layers as L
from ssv.ops.linear.cpu import packed_weight
_bf = {}
def bfw(w):
    e = _bf.get(id(w))
    if e is None or e[0] is not w:
        e = _bf[id(w)] = (w, torch.ops.mkldnn._reorder_linear_weight(w.detach().bfloat16(), batch_size=4))
    return e[1]
def bdense(x, w, b=None):
    x2 = x.reshape(-1, x.shape[-1]).bfloat16().contiguous()
    y = torch.ops.mkldnn._linear_pointwise(x2, bfw(w), None, "none", [], "").float()
    return y.view(*x.shape[:-1], w.shape[0])
llm._engine("nsa", True)   # loads the drafter
head = llm._drafter.head
mlp = head.midlayer.mlp
def mlp_fwd(self, x):
    wgu, wd = self.cpu_weights()
    gu, i = bdense(x, wgu), wd.shape[1]
    return bdense(F.silu(gu[..., :i]) * gu[..., i:], wd)
orig_dense = E.dense
def on():
    E.dense = bdense; mlp.forward = types.MethodType(mlp_fwd, mlp)
def off():
    E.dense = orig_dense; del mlp.forward
VARIANTS = {"fp32": (lambda: None, lambda: None), "bf16": (on, off)}
