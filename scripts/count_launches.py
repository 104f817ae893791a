"""Launches of one device-round AR step, counted on the CPU: the step runs under Triton's interpreter with
the CUDA glue path forced, every Triton launch and every ATen op that would be a kernel counted (views
excluded), at 2 and 4 layers, so per-layer and fixed parts separate. Prints them; JSON to $OUT or
bench/results. Usage: python3 scripts/count_launches.py"""
import json, os, sys
sys.path.insert(0, "."); sys.path.insert(0, "tests"); sys.path.insert(0, "scripts")
from launch_counter import NSA, Count, cnt  # noqa: E402  (first: the interpreter mode)
import torch  # noqa: E402
import ssv.model.layers as L, ssv.model.llama as LL  # noqa: E402
L.fused_glue = LL.fused_glue = lambda x: x.dim() == 2 and not torch.is_grad_enabled()
from conftest import make_tiny_model  # noqa: E402
from ssv.engine.device_round import DeviceEngine  # noqa: E402
from ssv.engine.runner import Runner  # noqa: E402


def count(attention, layers):
    t = make_tiny_model(1, vocab=64, n_layers=layers, n_heads=4, n_kv_heads=2, head_dim=64, hidden=128, intermediate=256)
    r = Runner(t, attention=attention, nsa=NSA, max_len=300, backend="triton")
    r.cache.rope = r.model.rope_table(r.cache.max_len + r.cache.scratch)   # as the Runner on CUDA
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
from ssv.bench.env import commit
res = {"env": {"device": "cpu (Triton interpreter; counts, not times)", "torch": torch.__version__,
               "triton": triton.__version__, "date": datetime.date.today().isoformat(), "commit": commit()},
       "launches": out}
path = os.path.join(os.environ.get("OUT", "bench/results"), f"launch-counts-{(res['env']['commit'] or 'unknown')[:7]}.json")
with open(path, "w") as f:
    json.dump(res, f, indent=1)
print("wrote", path)
