"""Launches of one speculative device round by phase (draft / verify / accept + commit), counted on
the CPU as scripts/count_launches.py counts an AR step: Triton's interpreter, the CUDA glue and the
fused EAGLE-3 drafter forced, the CUDA-only kernels (vocabulary and rank top-k, tree level, accept
walk, tree finish) swapped in for their torch twins; every Triton launch and every ATen op that would be a kernel (views excluded).
The tree is the GPU default (depth 6, top-k 8, 48 tokens); verify is counted at 4 and 6 layers (a head taps 3 distinct ones).
Usage: [LOOKUP=K] python3 scripts/count_round_launches.py [label]   (JSON to $OUT or bench/results)"""
import json, os, sys
sys.path.insert(0, "."); sys.path.insert(0, "tests"); sys.path.insert(0, "scripts")
from launch_counter import NSA, Count, cnt  # noqa: E402  (first: the interpreter mode)
import torch  # noqa: E402
import ssv.model.layers as L, ssv.model.llama as LL, ssv.draft.eagle3 as E  # noqa: E402
L.fused_glue = LL.fused_glue = E.fused_glue = lambda x: x.dim() == 2 and not torch.is_grad_enabled()
import ssv.spec.device as SD  # noqa: E402
import ssv.engine.device_round as DR  # noqa: E402
from ssv.ops.topk.ops import rank_topk, row_argmax, vocab_topk  # noqa: E402
from ssv.ops.tree.ops import tree_finish, tree_level  # noqa: E402
from ssv.ops.accept.ops import accept_greedy_round  # noqa: E402
SD._vocab_top = lambda lp, k, ids=None, clamp=False: (  # noqa: E731
    vocab_topk(lp.x.contiguous(), k, ids, clamp=clamp, logits=True, norm=lp.norm) if isinstance(lp, SD.Logits)
    else vocab_topk(lp.contiguous(), k, ids, clamp=clamp))
SD._tree_level = lambda x, k: tree_level  # noqa: E731
SD._tree_finish = lambda x, T, M: tree_finish  # noqa: E731


def _rank_top(x, k, largest=True, by_index=False):
    v, i = rank_topk(x.reshape(-1, x.shape[-1]).contiguous(), k, largest, by_index)
    return v.reshape(*x.shape[:-1], k), i.reshape(*x.shape[:-1], k)


SD._stable_top = _rank_top
DR.accept_greedy_round = lambda tree, logits, d, n, nxt, b: accept_greedy_round(  # noqa: E731
    tree.parents, tree.tokens, tree.scores, row_argmax(logits), d, n, nxt, b)
from conftest import make_tiny_model  # noqa: E402
from draft.helpers import tiny_head  # noqa: E402
from ssv.draft import Eagle3Drafter  # noqa: E402
from ssv.engine.device_round import DeviceEngine  # noqa: E402
from ssv.engine.runner import Runner  # noqa: E402
from ssv.engine.spec import SpecOptions  # noqa: E402
from ssv.spec.tree import TreeSpec  # noqa: E402


# LOOKUP=K: the round with a context lookup of K (the head's tree K nodes smaller: 48 rows)
LOOKUP = int(os.environ.get("LOOKUP", "0"))


def count(layers):
    t = make_tiny_model(1, vocab=256, n_layers=layers, n_heads=4, n_kv_heads=2, head_dim=64, hidden=128,
                        intermediate=256)
    r = Runner(t, attention="nsa", nsa=NSA, max_len=400, backend="triton")
    r.cache.rope = r.model.rope_table(r.cache.max_len + r.cache.scratch)   # as the Runner on CUDA
    d = Eagle3Drafter(tiny_head(t, draft_vocab=128), t, fused=True)
    with torch.no_grad():
        _, taps = r.prefill(list(range(1, 60)), taps=d.taps)
        from ssv.draft.drafter import join_prefill_taps
        d.commit(join_prefill_taps(taps), list(range(2, 61)))
    e = DeviceEngine(r, d, graphs=False)
    e.start(5, history=list(range(1, 60)))
    opts = SpecOptions(tree=TreeSpec(6, 8, 48 - LOOKUP), lookup=LOOKUP)
    e.spec_round(opts)
    phases, _ = e._spec_phases(opts)
    out = {}
    for (name, _), body in phases:
        cnt.clear()
        with Count(), torch.no_grad():
            body()
        out[name[0] if isinstance(name, tuple) else name] = dict(cnt)
    return out


a, b = count(4), count(6)
res = {}
for ph in a:
    if ph == "verify":
        per = {k: (b[ph].get(k, 0) - a[ph].get(k, 0)) // 2 for k in set(a[ph]) | set(b[ph])}
        fixed = {k: a[ph].get(k, 0) - 4 * per[k] for k in a[ph]}
        res[ph] = {"per_layer": sum(per.values()), "fixed": sum(fixed.values()),
                   "per_layer_ops": {k: v for k, v in per.items() if v}, "fixed_ops": {k: v for k, v in fixed.items() if v}}
        print(f"verify: {res[ph]['per_layer']} a layer + {res[ph]['fixed']}; 30 layers: "
              f"{30 * res[ph]['per_layer'] + res[ph]['fixed']}")
    else:
        res[ph] = {"total": sum(a[ph].values()), "ops": dict(sorted(a[ph].items(), key=lambda kv: -kv[1]))}
        print(f"{ph}: {res[ph]['total']}", dict(list(res[ph]["ops"].items())[:12]))
import datetime, triton  # noqa: E402
from ssv.bench.env import commit  # noqa: E402
env = {"device": "cpu (Triton interpreter; counts, not times)", "torch": torch.__version__, "triton": triton.__version__,
       "date": datetime.date.today().isoformat(), "commit": commit(), "tree": "depth 6, top-k 8, 48 tokens",
       "lookup": LOOKUP}
label = sys.argv[1] if len(sys.argv) > 1 else (env["commit"] or "unknown")[:7]
path = os.path.join(os.environ.get("OUT", "bench/results"), f"round-launches-{label}.json")
with open(path, "w") as f:
    json.dump({"env": env, "phases": res}, f, indent=1)
print("wrote", path)
