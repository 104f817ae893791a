"""The device round of every mode on random weights of the default model's shape and a random EAGLE-3
head (once the reproduction of the draft-phase capture failure, bench/NOTES.md): each round timed with
its phase events, its kernels counted by the profiler; a table, and JSON in $OUT or bench/results.
Run on a GPU from the repository root: python3 scripts/repro_draft_capture.py"""
import json, os, sys, time, warnings, torch
sys.path.insert(0, ".")
warnings.simplefilter("always")
from ssv.config import ModelConfig
from ssv.bench.e2e_steps import random_model, fill_cache
from ssv.draft import Eagle3Drafter
from ssv.draft.eagle3 import Eagle3Config, Eagle3Head
from ssv.engine.runner import Runner
from ssv.engine.device_round import DeviceEngine
from ssv.bench.e2e import mode_table, profile_rounds
from ssv.spec.tree import TreeSpec
from ssv.spec.accept import SamplingParams
cfg = ModelConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, n_layers=30, n_heads=9, n_kv_heads=3,
                  head_dim=64, max_seq_len=8192, tie_embeddings=True)
m = random_model(cfg)
head = Eagle3Head(Eagle3Config.for_target(cfg, 8192)).cuda().to(torch.bfloat16)
d = Eagle3Drafter(head, m)
table = mode_table(30, TreeSpec(6, 8, 48))
rows = []
# the last pass: the AR step in a cache sized as `ssv bench e2e` sizes it (8K contexts + room): the
# launches are sized for the capacity, so this row shows what capacity costs at the same length
for att, modes, cap in (("nsa", ["ar-nsa", "sd-naive", "ssv strict", "ssv approx C16", "sampled"], 4096 + 600),
                        ("dense", ["ar dense", "eagle3 dense"], 4096 + 600), ("nsa", ["ar-nsa"], 8192 + 384)):
    r = Runner(m, attention=att, max_len=cap)
    fill_cache(r, 4096, torch.Generator(device="cuda").manual_seed(0))
    d.reset(); d.commit([torch.randn(64, 576, device="cuda", dtype=torch.bfloat16) for _ in range(3)], torch.randint(0, 8192, (64,), device="cuda"))
    eng = DeviceEngine(r, d)
    eng.start(7)
    for mode in modes:
        opts = table["ssv strict" if mode == "sampled" else mode][1]
        params = SamplingParams(temperature=0.7) if mode == "sampled" else None
        step = (lambda: eng.ar_step()) if opts is None else (lambda: eng.spec_round(opts, params))
        for _ in range(3): step()
        eng.timing, eng.phase_ms = True, {}
        torch.cuda.synchronize(); t0 = time.perf_counter()
        for _ in range(20): step()
        wall = (time.perf_counter() - t0) / 20 * 1e3
        eng.timing = False
        ph = {k: sorted(v)[len(v) // 2] for k, v in eng.phase_ms.items()}
        prof = profile_rounds(eng, opts, params, 6)
        rows.append({"attention": att, "mode": mode, "capacity": cap, "round_wall_ms": wall, **{f"{k}_ms": v for k, v in ph.items()},
                     "kernels_per_round": prof["launches_per_round"], "gpu_busy_fraction": prof["gpu_busy_fraction"]})
        print(f"{att:5s} {mode:16s} cap {cap:5d} wall/round {wall:7.3f} ms  kernels {prof['launches_per_round']:.0f} busy "
              f"{prof['gpu_busy_fraction']:.2f}  graphed {sorted(set(k[0] for k in eng._graphs))}  "
              + " ".join(f"{k} {v:.3f}" for k, v in ph.items()), flush=True)
        r.cache.dlen.fill_(4096); r.cache.length = 4096
from ssv.bench.env import environment
env = environment()
out = os.path.join(os.environ.get("OUT", "bench/results"), f"device-round-{env['commit']}.json")
with open(out, "w") as f:
    json.dump({"env": env, "rows": rows}, f, indent=1)
print("wrote", out)
