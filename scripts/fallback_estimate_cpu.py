"""How well the AR fall-back's estimate of a round's accepted length (`ArFallback.expected_length`) tracks
the measured one: the default model and head on the CPU (fp32), held-out texts of every family, strict
speculative decoding measures MAL; the same continuation's drafter rows, committed one by one, give the
head's top-1 / top-8 hit rates on the next token. Usage: python3 scripts/fallback_estimate_cpu.py CONTEXT NEW
(prompts: .stage/e2e-prompts.json); a table, JSON to $OUT or bench/results."""
import datetime, json, os, sys, time, torch
sys.path.insert(0, ".")
torch.set_num_threads(2)
from ssv.bench.e2e import prompt_ids
from ssv.bench.env import commit
from ssv.cli import load_model
from ssv.draft import Eagle3Drafter, load_default_head
from ssv.engine.runner import Runner
from ssv.engine.spec import SpecOptions, generate_spec
from ssv.spec.accept import SamplingParams
from ssv.spec.fallback import ArFallback
from ssv.spec.tree import TreeSpec

G = SamplingParams(temperature=0.0)
model, tok = load_model("default", "cpu", progress=False)
head = load_default_head(target_cfg=model.cfg)[0]
texts = json.load(open(".stage/e2e-prompts.json"))
ctx, new = int(sys.argv[1]), int(sys.argv[2])
tree = TreeSpec(6, 8, 48)
rows = []
for fam in ("code", "prose", "chat"):
    for doc in range(len(texts[fam])):
        ids = prompt_ids(tok, fam, texts[fam][doc], ctx)
        r = Runner(model, attention="nsa", max_len=ctx + new + 64)
        t0 = time.time()
        sp = generate_spec(r, Eagle3Drafter(head, model), ids, G, new, opts=SpecOptions(tree=tree))
        out = sp.token_ids
        r2, d2 = Runner(model, attention="nsa", max_len=ctx + new + 64), Eagle3Drafter(head, model)
        _, chunks = r2.prefill(ids + out[:-1], taps=d2.taps)
        taps = [torch.cat([c[i] for c in chunks]) for i in range(3)]
        P = len(ids)
        d2.commit([t[:P] for t in taps], torch.tensor(ids[1:] + [out[0]]))
        h1 = hk = n = 0
        for i in range(len(out) - 2):
            top = d2.commit([t[P + i:P + i + 1] for t in taps], torch.tensor([out[i + 1]])).topk(tree.top_k).indices.tolist()
            h1, hk, n = h1 + (top[0] == out[i + 2]), hk + (out[i + 2] in top), n + 1
        a1 = h1 / n
        row = {"family": fam, "doc": doc, "context": len(ids), "mean_accepted_length": sp.stats["mean_accepted_length"],
               "top1": h1, "topk": hk, "pairs": n,
               "expected_length": ArFallback().expected_length(h1, hk, n, tree.depth),
               "top1_chain": (1 - min(a1, 0.999) ** (tree.depth + 1)) / (1 - min(a1, 0.999))}
        rows.append(row)
        print(f"{fam} {doc} MAL {row['mean_accepted_length']:.2f} estimate {row['expected_length']:.2f} "
              f"top-1 chain {row['top1_chain']:.2f} ({time.time() - t0:.0f} s)", flush=True)
res = {"env": {"device": "cpu (2 cores, fp32)", "torch": torch.__version__, "date": datetime.date.today().isoformat(),
               "commit": commit()}, "tree": vars(tree), "new_tokens": new, "rows": rows}
with open(os.path.join(os.environ.get("OUT", "bench/results"), "fallback-estimate-cpu.json"), "w") as f:
    json.dump(res, f, indent=1)
