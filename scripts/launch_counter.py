"""The launch counter of scripts/count_launches.py and count_round_launches.py: under Triton's
interpreter, every Triton launch (not the nested calls inside one) and every ATen op that would be a
kernel (views excluded) is counted in `cnt` while a `Count()` mode is active. Import it before any
kernel module: it sets the interpreter mode."""
import collections
import os

os.environ["TRITON_INTERPRET"] = "1"
import triton.runtime.interpreter as I  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from ssv.config import NSAConfig  # noqa: E402

# the tiny NSA shape both counts use
NSA = NSAConfig(cmp_block=8, cmp_stride=4, slc_block=16, n_select=4, forced_local=1, window=16)
VIEWS = {"view", "_unsafe_view", "t", "transpose", "expand", "as_strided", "unsqueeze", "squeeze", "select", "slice",
         "alias", "permute", "reshape", "detach", "lift_fresh", "empty", "empty_like", "new_empty", "split", "unbind",
         "empty_strided"}
cnt, _inside = collections.Counter(), [0]
_run0 = I.InterpretedFunction.run


def _run(self, *a, **k):
    if _inside[0] == 0:
        cnt["triton:" + self.fn.__name__] += 1
    _inside[0] += 1
    try:
        return _run0(self, *a, **k)
    finally:
        _inside[0] -= 1


I.InterpretedFunction.run = _run


class Count(TorchDispatchMode):
    def __torch_dispatch__(self, f, types, a=(), k=None):
        name = f.__name__.split(".")[0]
        if name not in VIEWS and _inside[0] == 0:
            cnt["aten:" + name] += 1
        return f(*a, **(k or {}))
