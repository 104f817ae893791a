"""Where a graphed step's GPU time goes at the Llama-3.1-8B shape (random bf16 weights, the step table's setup):
the ar-nsa step, and the 48-node verify pass of ssv strict (recorded-overlap selections), sd-naive and verify
dense, each replayed from a graph under the torch profiler, kernels grouped by name, us a step; a table and
JSON in $OUT. PDL=0 (default) launches without programmatic dependent launch, so each kernel's time is its own.
Run on a GPU from the repository root: python3 scripts/profile_steps.py (CTX, SHAPE, STEPS, REPS)."""
import json, os, sys, torch
sys.path.insert(0, ".")
if os.environ.get("PDL", "0") == "0":
    import ssv.ops.pdl
    ssv.ops.pdl._hopper = lambda index: False
from torch.profiler import ProfilerActivity, profile
from ssv.attention import VerifyOptions
from ssv.attention_device import device_plan
from ssv.bench.e2e_steps import (RECORDED_OVERLAP, SHAPES, capture_graph, fill_cache, random_model, recorded_selections,
                                 synthetic_tree)
from ssv.bench.env import environment
from ssv.bench.synthetic import synthetic_selection
from ssv.engine.device_round import DeviceEngine
from ssv.engine.runner import Runner
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kernel_table import by_kernel, print_rows  # noqa: E402

CTX = int(os.environ.get("CTX", "65536"))
SHAPE = os.environ.get("SHAPE", "llama3.1-8b")
REPS = int(os.environ.get("REPS", "10"))
STEPS = os.environ.get("STEPS", "ar-nsa,ssv strict,sd-naive,verify dense").split(",")
cfg = SHAPES[SHAPE]
model = random_model(cfg)
gen = torch.Generator(device="cuda").manual_seed(0)
depth, mask = synthetic_tree(48, torch.Generator().manual_seed(CTX), "cuda")
tokens = torch.randint(0, cfg.vocab_size, (48,), device="cuda")
res = {"env": environment(), "shape": SHAPE, "context": CTX, "pdl": os.environ.get("PDL", "0") != "0", "steps": {}}


def prof(name, g, before):
    for _ in range(3):
        before()
        g.replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(REPS):
            before()
            g.replay()
        torch.cuda.synchronize()
    rows = by_kernel(p, REPS, "step", width=70, copies=False)
    res["steps"][name] = rows
    tot = sum(x["us_per_step"] for x in rows)
    print(f"== {name} at {CTX}: kernel time {tot:.0f} us a step, {sum(x['per_step'] for x in rows):.0f} kernels")
    print_rows(rows, "step", 16)


with torch.no_grad():
    for att in ("nsa", "dense"):
        runner = Runner(model, attention=att, max_len=CTX + 256)
        fill_cache(runner, CTX, gen)
        eng = DeviceEngine(runner)
        dlen0 = runner.cache.dlen.clone()
        reset = lambda: runner.cache.dlen.copy_(dlen0)  # noqa: E731
        if att == "nsa" and "ar-nsa" in STEPS:
            prof("ar-nsa", capture_graph(eng._ar_body, before=reset), reset)
        todo = {"verify dense": VerifyOptions()} if att == "dense" else {"sd-naive": VerifyOptions(1),
                                                                          "ssv strict": VerifyOptions(4)}
        for name, vo in todo.items():
            if name not in STEPS:
                continue
            plan = device_plan(att, runner.nsa, vo, 48, runner.cache, cfg.n_heads, True)
            if att == "nsa":
                F, J = 3, RECORDED_OVERLAP   # as the step table: adjacent Jaccard J with F forced blocks
                f = runner.nsa.n_select - F
                keep = min(1.0, max(0.0, (J * (F + 2 * f) - F) / (f * (1 + J))))
                sel = synthetic_selection((CTX + depth).cpu(), cfg.n_kv_heads, runner.nsa, keep,
                                          torch.Generator().manual_seed(CTX)).to(device="cuda", dtype=torch.int32)
                plan = recorded_selections(plan, sel)

            def verify(plan=plan):
                pos = runner.cache.dlen.long() + depth
                plan.plan(runner.cache.dlen, pos, mask)
                model(tokens, pos, plan, runner.cache)
            prof(name, capture_graph(verify), lambda: None)
        del runner, eng
        torch.cuda.empty_cache()
out = os.path.join(os.environ.get("OUT", "bench/results"), f"step-kernels-{SHAPE}-{CTX}-{res['env']['commit']}.json")
with open(out, "w") as f:
    json.dump(res, f, indent=1)
print("wrote", out)
