"""Is the prompt evidence for the AR fall-back's first decision (`ArFallback.prime`)? The default model
and head on the CPU (fp32): each held-out text of every family is prefilled at each context, and the
drafter's commit counts over the prompt's last M rows how often the head's top-1 / top-8 drafts name
the next token (`Eagle3Drafter.commit(agree=...)`), giving the estimated accepted length of a 48-node
round. Set beside the MAL measured on the same prompts (no fall-back) in bench/results/e2e-cuda-e513856.json.
Usage: python3 scripts/fallback_prior_cpu.py "1024 2048 4096" "256 1024"; JSON to $OUT or bench/results."""
import datetime, json, os, sys, time, torch
sys.path.insert(0, ".")
torch.set_num_threads(2)
from ssv.bench.e2e import prompt_ids
from ssv.bench.env import commit
from ssv.cli import load_model
from ssv.draft import Eagle3Drafter, load_default_head
from ssv.engine.runner import Runner
from ssv.spec.fallback import ArFallback
from ssv.spec.tree import TreeSpec

model, tok = load_model("default", "cpu", progress=False)
head = load_default_head(target_cfg=model.cfg)[0]
texts = json.load(open(".stage/e2e-prompts.json"))
contexts = [int(c) for c in sys.argv[1].split()]
tails = [int(m) for m in sys.argv[2].split()]
tree = TreeSpec(6, 8, 48)
mal = {}
try:
    for r in json.load(open("bench/results/e2e-cuda.json"))["summary"]:
        if r["mode"] == "ssv strict no-fallback":
            mal[(r["family"], r["context"])] = r["mean_accepted_length"]
except (OSError, KeyError):
    pass
rows = []


def save():
    res = {"env": {"device": "cpu (2 cores, fp32)", "torch": torch.__version__,
                   "date": datetime.date.today().isoformat(), "commit": commit()}, "tree": vars(tree), "rows": rows}
    with open(os.path.join(os.environ.get("OUT", "bench/results"), "fallback-prior-cpu.json"), "w") as f:
        json.dump(res, f, indent=1)


for ctx in contexts:
    for fam in ("code", "prose", "chat"):
        for doc in range(len(texts[fam])):
            ids = prompt_ids(tok, fam, texts[fam][doc], ctx)
            t0 = time.time()
            r = Runner(model, attention="nsa", max_len=len(ids) + 8)
            _, chunks = r.prefill(ids, taps=Eagle3Drafter(head, model).taps)
            taps = [torch.cat([c[i] for c in chunks]) for i in range(3)]
            row = {"family": fam, "doc": doc, "target_context": ctx, "context": len(ids),
                   "gpu_mal_no_fallback": mal.get((fam, ctx)) if doc == 0 else None}
            for m in tails:
                d = Eagle3Drafter(head, model)
                d.commit(taps, torch.tensor(ids[1:] + [0]), agree=(tree.top_k, m + 1))
                h1, hk, n = d.agreement
                row[f"last{m}"] = {"top1": h1, "topk": hk, "pairs": n,
                                   "expected_length": ArFallback().expected_length(h1, hk, n, tree.depth)}
            rows.append(row)
            save()
            print(ctx, fam, doc, " ".join(f"M={m}: {row[f'last{m}']['expected_length']:.2f}" for m in tails),
                  "gpu MAL", row["gpu_mal_no_fallback"], f"({time.time() - t0:.0f} s)", flush=True)
