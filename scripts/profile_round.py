"""Where a graphed round's GPU time goes: the kernels of the AR step and of an ssv strict round (random
weights of the default model's shape, 4K context), grouped by kernel name, per round; a table, and
JSON in $OUT or bench/results. Run on a GPU from the repository root: python3 scripts/profile_round.py
(MODES, CTX, CAP, ROUNDS: the modes, context, cache capacity and timed rounds; TEMP: sampled rounds
at that temperature, the file named -t<TEMP>; launch-policy constants patched first:
python3 scripts/profile_round.py verify_policy.FOLD_MAX_SPLITS=64)"""
import json, os, sys, time, torch
sys.path.insert(0, ".")
from torch.profiler import ProfilerActivity, profile
from ssv.config import ModelConfig
from ssv.bench.e2e_steps import random_model, fill_cache
from ssv.bench.env import environment
from ssv.draft import Eagle3Drafter
from ssv.draft.eagle3 import Eagle3Config, Eagle3Head
from ssv.engine.runner import Runner
from ssv.engine.device_round import DeviceEngine
from ssv.bench.e2e import mode_table
from ssv.spec.accept import SamplingParams
from ssv.spec.tree import TreeSpec
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kernel_table import by_kernel, print_rows  # noqa: E402
TEMP = float(os.environ.get("TEMP", "0"))
# PDL=0: every kernel launched without programmatic dependent launch, so a kernel's recorded time is
# its own (under PDL it includes its programs' wait after an early start) and the table says what
# each kernel costs in isolation; the round itself then runs slower
NOPDL = os.environ.get("PDL", "1") == "0"
if NOPDL:
    import ssv.ops.pdl
    ssv.ops.pdl._hopper = lambda index: False
PARAMS = SamplingParams(temperature=TEMP) if TEMP > 0 else None   # None: greedy, as the engine's default
for patch in sys.argv[1:]:   # module.NAME=int of ssv.ops.nsa: a launch policy variant, named in the file
    import importlib
    name, val = patch.split("=")
    mod, attr = name.rsplit(".", 1)
    setattr(importlib.import_module(f"ssv.ops.nsa.{mod}"), attr, int(val))
cfg = ModelConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, n_layers=30, n_heads=9, n_kv_heads=3,
                  head_dim=64, max_seq_len=8192, tie_embeddings=True)
m = random_model(cfg)
d = Eagle3Drafter(Eagle3Head(Eagle3Config.for_target(cfg, 8192)).cuda().to(torch.bfloat16), m)
table = mode_table(30, TreeSpec(6, 8, 48))
CTX = int(os.environ.get("CTX", "4096"))
CAP = int(os.environ.get("CAP", str(8192 + 384)))
MODES = os.environ.get("MODES", "ar-nsa,sd-naive,ssv strict,ar dense,eagle3 dense").split(",")
d.commit([torch.randn(64, 576, device="cuda", dtype=torch.bfloat16) for _ in range(3)], torch.randint(0, 8192, (64,), device="cuda"))
engines = {}
for att in ("nsa", "dense"):
    r = Runner(m, attention=att, max_len=CAP)
    fill_cache(r, CTX, torch.Generator(device="cuda").manual_seed(0))
    engines[att] = (r, DeviceEngine(r, d))
    engines[att][1].start(7)
res = {"env": environment(), "pdl": not NOPDL, "context": CTX, "capacity": CAP, "temperature": TEMP, "rounds": {}, "round_ms": {},
       "patches": sys.argv[1:]}
for mode in MODES:
    att, opts = table[mode]
    r, eng = engines[att]
    step = (lambda: eng.ar_step(PARAMS)) if opts is None else (lambda: eng.spec_round(opts, PARAMS))
    for _ in range(3):
        step()
    n = int(os.environ.get("ROUNDS", "10"))
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        step()
    torch.cuda.synchronize()
    res["round_ms"][mode] = (time.perf_counter() - t0) * 1e3 / n
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            step()
        torch.cuda.synchronize()
    rows = by_kernel(prof, n, "round")
    res["rounds"][mode] = rows
    tot = sum(x["us_per_round"] for x in rows)
    print(f"== {mode}: round {res['round_ms'][mode]*1e3:.0f} us, kernel time {tot:.0f} us per round, {sum(x['per_round'] for x in rows):.0f} kernels")
    print_rows(rows, "round", 22)
    r.cache.dlen.fill_(CTX); r.cache.length = CTX
tag = ("".join("-" + p.split(".")[-1].replace("=", "") for p in sys.argv[1:]) + (f"-t{TEMP:g}" if TEMP > 0 else "")
       + ("-nopdl" if NOPDL else ""))
out = os.path.join(os.environ.get("OUT", "bench/results"), f"round-kernels-{res['env']['commit']}{tag}.json")
with open(out, "w") as f:
    json.dump(res, f, indent=1)
print("wrote", out)
