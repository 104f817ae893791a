"""The lookup's cost on the graphed CUDA round, without the checkpoint (which a device call carries
only in parts): the default model's shape with random bf16 weights and a random EAGLE-3 head, a
4K-token prompt that repeats a phrase (so the lookup finds chains), greedy. Per mode: the graphed
round's phase times (draft / verify / accept, CUDA events), wall ms a round, and whether its tokens
are the AR run's. MAL here is meaningless (random weights); the real model's is `ssv bench e2e`'s.
Usage: python3 scripts/gpu_lookup_round.py [context]   (JSON to $OUT or bench/results)"""
import datetime
import json
import os
import sys

import torch

sys.path.insert(0, ".")
from ssv.bench.e2e_steps import SMOLLM2, random_model  # noqa: E402
from ssv.draft import Eagle3Config, Eagle3Drafter, Eagle3Head  # noqa: E402
from ssv.engine.device_round import DeviceEngine  # noqa: E402
from ssv.engine.generate import generate_ar  # noqa: E402
from ssv.engine.runner import Runner  # noqa: E402
from ssv.engine.spec import SpecOptions, generate_spec  # noqa: E402
from ssv.spec.accept import SamplingParams  # noqa: E402
from ssv.spec.tree import TreeSpec  # noqa: E402

context = int(sys.argv[1]) if len(sys.argv) > 1 else 4096
new = 96
torch.manual_seed(0)
cfg, dv = SMOLLM2, 12288
if torch.cuda.is_available():
    model = random_model(cfg)
else:   # a syntax check of this script on the CPU: a small shape, fp32
    import dataclasses
    from ssv.model import Transformer
    cfg, dv, context, new = dataclasses.replace(SMOLLM2, vocab_size=512, n_layers=4, hidden_size=128, n_heads=2,
                                                n_kv_heads=1, intermediate_size=256), 256, 300, 8
    model = Transformer(cfg).eval()
hcfg = Eagle3Config.for_target(cfg, dv)
head = Eagle3Head(hcfg)
with torch.no_grad():
    for p in head.parameters():
        p.normal_(0.0, 0.02) if p.dim() > 1 else p.fill_(1.0)
    head.set_vocab(torch.randperm(cfg.vocab_size)[:dv].sort().values)
if torch.cuda.is_available():
    head = head.cuda().to(torch.bfloat16)
head = head.eval()
drafter = Eagle3Drafter(head, model)
phrase = torch.randint(0, cfg.vocab_size, (97,), generator=torch.Generator().manual_seed(1)).tolist()
prompt = (phrase * (context // len(phrase) + 1))[:context]
runner = Runner(model, attention="nsa", max_len=context + new + 256)
eng = DeviceEngine(runner, drafter)
greedy = SamplingParams(temperature=0.0)
modes = {"ar-nsa": None, "ssv strict 6x8x48": SpecOptions(TreeSpec(6, 8, 48)),
         "ssv strict 6x8x40 + lookup 8": SpecOptions(TreeSpec(6, 8, 40), lookup=8)}
rows, ar = [], None
for rep in range(2):   # rep 0 warms up (captures, compiles); rep 1 is timed
    for name, opts in modes.items():
        eng.timing, eng.phase_ms = rep == 1, {}
        if opts is None:
            res = generate_ar(runner, prompt, greedy, new, engine=eng)
            ar = res.token_ids
        else:
            res = generate_spec(runner, drafter, prompt, greedy, new, opts=opts, engine=eng)
        if rep == 0:
            continue
        st = res.stats
        steps = st.get("rounds", 0) + st.get("ar_steps", 0) or len(res.token_ids)
        row = {"mode": name, "context": context, "new_tokens": len(res.token_ids),
               "tokens_per_second": st["tokens_per_second"], "wall_ms_per_step": 1e3 * st["decode_seconds"] / steps,
               "mean_accepted_length": st.get("mean_accepted_length", 1.0),
               "phase_ms": {k: sum(v) / len(v) for k, v in eng.phase_ms.items() if v},
               "identical_to_ar": res.token_ids == ar, "graphs": sorted({k[0] for k in eng._graphs}),
               "eager": sorted(str(k) for k in eng._eager)}
        rows.append(row)
        ph = " ".join(f"{k} {v:.3f}" for k, v in row["phase_ms"].items())
        print(f"{name:32s} {row['wall_ms_per_step']:.3f} ms/step  [{ph}]  MAL {row['mean_accepted_length']:.2f}  "
              f"identical {row['identical_to_ar']}  eager {row['eager']}", flush=True)
env = {"device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu", "torch": torch.__version__, "date": datetime.date.today().isoformat(),
       "commit": os.environ.get("SSV_COMMIT", "unknown"), "shape": "smollm2-135m, random bf16 weights",
       "head": "random EAGLE-3 head, draft vocabulary 12288"}
out = os.path.join(os.environ.get("OUT", "bench/results"), f"lookup-round-{context}.json")
with open(out, "w") as f:
    json.dump({"env": env, "rows": rows}, f, indent=1)
print("wrote", out)
