"""The sampled accept's op count (`ssv.spec.device_accept.accept_sample_device`), counted on the CPU as
scripts/count_launches.py counts a step (every ATen op that would be a kernel, views excluded): a
random tree of the lookup round's sampled bucket (48 rows, up to 9 children a node, depth 8) over the
default model's vocabulary. On CUDA each op is a launch inside the accept graph.
Usage: python3 scripts/count_accept_ops.py [label]   (JSON to $OUT or bench/results)"""
import json
import os
import sys

sys.path.insert(0, ".")
sys.path.insert(0, "scripts")
from launch_counter import Count, cnt  # noqa: E402  (first: the interpreter mode)
import torch  # noqa: E402

from ssv.bench.env import environment  # noqa: E402
from ssv.spec.accept import SamplingParams  # noqa: E402
from ssv.spec.device import DeviceTree  # noqa: E402
from ssv.spec.device_accept import accept_sample_device  # noqa: E402

T, V, K, D = 48, 49152, 9, 8
g = torch.Generator().manual_seed(0)
par, dep = [-1], [0]
for v in range(1, T):   # parents precede children, at most K children, depth <= D
    while True:
        p = int(torch.randint(0, v, (1,), generator=g))
        if dep[p] < D and par.count(p) < K:
            break
    par.append(p)
    dep.append(dep[p] + 1)
tree = DeviceTree(torch.randint(0, V, (T,), generator=g), torch.tensor(par), torch.rand(T, generator=g), torch.tensor(dep))
logits, coins = torch.randn(T, V, generator=g), torch.rand(T, K + 1, generator=g)
cnt.clear()
with Count():
    accept_sample_device(tree, logits, SamplingParams(temperature=0.7), coins, D, K)
label = sys.argv[1] if len(sys.argv) > 1 else "local"
out = {"env": environment("cpu"), "shape": {"rows": T, "vocab": V, "top_k": K, "depth": D}, "label": label,
       "ops": sum(cnt.values()), "by_op": dict(cnt.most_common())}
print(label, out["ops"], "ops;", dict(cnt.most_common(6)))
d = os.environ.get("OUT", "bench/results")
os.makedirs(d, exist_ok=True)
with open(os.path.join(d, f"accept-sample-ops-{label}.json"), "w") as f:
    json.dump(out, f, indent=1)
