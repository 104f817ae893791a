"""Launches of one device-round AR step, counted on the CPU: the step runs under Triton's interpreter with
the CUDA glue path forced, every Triton launch and every ATen op that would be a kernel counted (views
excluded), at 2 and 4 layers, so per-layer and fixed parts separate. Prints them; JSON to $OUT or
bench/results. Usage: python3 scripts/count_launches.py"""
import collections, json, os, sys
os.environ["TRITON_INTERPRET"] = "1"
sys.path.insert(0, "."); sys.path.insert(0, "tests")
import torch
from torch.utils._python_dispatch import TorchDispatchMode
import ssv.model.layers as L, ssv.model.llama as LL
L.fused_glue = LL.fused_glue = lambda x: x.dim() == 2 and not torch.is_grad_enabled()
import triton.runtime.interpreter as I
from conftest import make_tiny_model
from ssv.config import NSAConfig
from ssv.engine.device_round import DeviceEngine
from ssv.engine.runner import Runner

NSA = NSAConfig(cmp_block=8, cmp_stride=4, slc_block=16, n_select=4, forced_local=1, window=16)
VIEWS = {"view", "_unsafe_view", "t", "transpose", "expand", "as_strided", "unsqueeze", "squeeze", "select", "slice",
         "alias", "permute", "reshape", "detach", "lift_fresh", "empty", "empty_like", "new_empty", "split", "unbind",
         "empty_strided"}
cnt, inside = collections.Counter(), [0]
run0 = I.InterpretedFunction.run


def run(self, *a, **k):
    if inside[0] == 0:
        cnt["triton:" + self.fn.__name__] += 1
    inside[0] += 1
    try:
        return run0(self, *a, **k)
    finally:
        inside[0] -= 1


I.InterpretedFunction.run = run


class Count(TorchDispatchMode):
    def __torch_dispatch__(self, f, types, a=(), k=None):
        name = f.__name__.split(".")[0]
        if name not in VIEWS and inside[0] == 0:
            cnt["aten:" + name] += 1
        return f(*a, **(k or {}))


def count(attention, layers):
    t = make_tiny_model(1, vocab=64, n_layers=layers, n_heads=4, n_kv_heads=2, head_dim=64, hidden=128, intermediate=256)
    r = Runner(t, attention=attention, nsa=NSA, max_len=300, backend="triton")
    with torch.no_grad():
        r.prefill(list(range(1, 60)))
    e = DeviceEngine(r, graphs=False)
    e.start(5)
    e.ar_step()
    cnt.clear()
    with Count(), torch.no_grad():
        e._ar_body()
    return dict(cnt)


out = {}
for att in ("nsa", "dense"):
    a, b = count(att, 2), count(att, 4)
    per = {k: (b.get(k, 0) - a.get(k, 0)) // 2 for k in set(a) | set(b)}
    fixed = {k: a.get(k, 0) - 2 * per[k] for k in a}
    out[att] = {"per_layer": sum(per.values()), "fixed": sum(fixed.values()),
                "per_layer_ops": {k: v for k, v in per.items() if v}, "fixed_ops": {k: v for k, v in fixed.items() if v}}
    print(f"{att}: {out[att]['per_layer']} launches per layer, {out[att]['fixed']} fixed; "
          f"a 30-layer step: {30 * out[att]['per_layer'] + out[att]['fixed']}")
import datetime, triton
from ssv.bench.kernels import _commit
res = {"env": {"device": "cpu (Triton interpreter; counts, not times)", "torch": torch.__version__,
               "triton": triton.__version__, "date": datetime.date.today().isoformat(), "commit": _commit()},
       "launches": out}
path = os.path.join(os.environ.get("OUT", "bench/results"), f"launch-counts-{(res['env']['commit'] or 'unknown')[:7]}.json")
with open(path, "w") as f:
    json.dump(res, f, indent=1)
print("wrote", path)
