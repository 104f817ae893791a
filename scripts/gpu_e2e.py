"""On the GPU: greedy `--mode ssv --precision strict` (Triton kernels, bf16) against `--mode ar` on real
long prompts, divergences classified by the AR top-2 logit margin; routing recorded for the bench."""
import inspect, json, os, sys, time, typing
import torch
from ssv.cli import load_model
from ssv.engine.runner import Runner
from ssv.engine.generate import generate_ar
from ssv.engine.spec import SpecOptions, generate_spec
from ssv.attention import VerifyOptions, StepMeta
from ssv.spec.tree import TreeSpec
from ssv.spec.accept import SamplingParams
from ssv.draft import Eagle3Drafter, load_eagle3

EPS = 0.25  # near-tie: AR top-2 logit margin below this (bf16 logits carry ~1e-2 relative error)
out = os.environ.get("OUT", "/tmp")
model, tok = load_model("default", "cuda")
head, _ = load_eagle3(sys.argv[1], device="cuda", dtype=torch.bfloat16, target=model.cfg)
drafter = Eagle3Drafter(head, model)
doc = tok.encode(inspect.getsource(typing))
prompts = {"typing.py[:6000]": doc[:6000], "typing.py[9000:13000]": doc[9000:13000],
           "chat": tok.encode(tok.apply_chat_template([{"role": "user", "content": "Explain how a hash map works."}]))}
res = []
record = []
for name, ids in prompts.items():
    r = Runner(model, attention="nsa")
    t0 = time.time(); ar = generate_ar(r, ids, SamplingParams(), 64); t_ar = time.time() - t0
    for mode, opts in (("sd-naive", VerifyOptions(1)), ("ssv", VerifyOptions(4))):
        rr = Runner(model, attention="nsa", record=record if (mode == "ssv" and name != "chat") else None)
        so = SpecOptions(TreeSpec(6, 4, 32), "pos", opts)
        sd = generate_spec(rr, drafter, ids, SamplingParams(), 64, so)
        a, b = ar.token_ids, sd.token_ids
        div = next((i for i in range(min(len(a), len(b))) if a[i] != b[i]), None)
        margin = None
        if div is not None:  # AR logits at the divergence point
            r.reset(); lg, _ = r.prefill(ids + a[:div])
            top = lg.float().topk(2).values
            margin = float(top[0] - top[1])
        res.append(dict(prompt=name, context=len(ids), mode=mode, identical=a == b, diverge_at=div,
                        margin=margin, near_tie=(margin is not None and margin < EPS),
                        rounds=sd.stats["rounds"], mal=sd.stats["mean_accepted_length"], ar_s=t_ar))
        print(res[-1], flush=True)
torch.save({"model": "default", "records": record}, os.path.join(out, "routing.pt"))
json.dump({"eps": EPS, "device": torch.cuda.get_device_name(0), "results": res},
          open(os.path.join(out, "e2e.json"), "w"), indent=1)
n = len(res); bad = sum(1 for x in res if not x["identical"] and not x["near_tie"])
print(f"runs {n}, identical {sum(x['identical'] for x in res)}, near-tie divergences "
      f"{sum(x['near_tie'] for x in res)}, other divergences {bad}")
