"""Where greedy strict / sd-naive first differ from ar-nsa on one e2e prompt, in bf16 and in fp32 on the
GPU: the first differing token, ar's top-2 margin there from its own decode step's logits (not a
teacher-forced prefill's), and the fp32 model's margin at the same point. Exploration for the
"strict diverges only at near-ties" criterion (#11), not a benchmark of record. Writes OUT.json.
    python3 scripts/diverge_probe.py --model GGUF --prompts e2e-prompts.json --family code --context 8192 OUT.json
"""
from __future__ import annotations

import argparse
import datetime
import json
import os

import torch
import triton

from ssv.bench.e2e import first_diff, mode_table, prompt_ids
from ssv.cli import load_model
from ssv.draft import load_drafter
from ssv.engine.device_round import DeviceEngine
from ssv.engine.generate import generate_ar
from ssv.engine.runner import Runner
from ssv.engine.spec import generate_spec
from ssv.spec.accept import SamplingParams
from ssv.spec.tree import TreeSpec

GREEDY = SamplingParams(temperature=0.0)


def run(dtype: str, args, ids_text) -> dict:
    model, tok = load_model(args.model, args.device, dtype)
    drafter = load_drafter("default", model)
    ids = prompt_ids(tok, args.family, ids_text, args.context)
    table = mode_table(model.cfg.n_layers, TreeSpec(depth=6, top_k=8, total_tokens=48))
    runner = Runner(model, attention="nsa", max_len=len(ids) + args.new_tokens + 256)
    eng = DeviceEngine(runner, drafter)
    ar = generate_ar(runner, ids, GREEDY, args.new_tokens, engine=eng).token_ids
    out = {"dtype": dtype, "context": len(ids), "ar": ar}
    for mode in ("sd-naive", "ssv strict"):
        toks = generate_spec(runner, drafter, ids, GREEDY, args.new_tokens, opts=table[mode][1], engine=eng).token_ids
        out[mode] = {"first_diff": first_diff(toks, ar), "tokens": toks}
    # ar's host steps record each token's top-2 margin (the same AR steps, uncaptured)
    host = generate_ar(runner, ids, GREEDY, args.new_tokens, margins=True)
    out["ar_host_equal"] = first_diff(host.token_ids, ar)
    out["ar_step_margins"] = host.stats["top2_margins"]
    del eng, runner, drafter, model
    torch.cuda.empty_cache()
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--model", default="default")
    ap.add_argument("--prompts", required=True)
    ap.add_argument("--family", default="code")
    ap.add_argument("--context", type=int, default=8192)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtypes", default="bfloat16,float32")
    ap.add_argument("--qkv-ar-tiles", action="store_true",
                    help="q|k|v at the verify pass's rows in the AR step's 16-row tiles (probe_invariance.py)")
    a = ap.parse_args()
    if a.qkv_ar_tiles:
        import ssv.ops.linear.policy as policy
        from probe_invariance import invariant_table
        policy.TILES = invariant_table(48)
    text = json.load(open(a.prompts))[a.family][0]
    env = dict(device=torch.cuda.get_device_name() if a.device == "cuda" else "cpu", torch=torch.__version__,
               triton=triton.__version__,
               date=datetime.date.today().isoformat(), commit=os.environ.get("SSV_COMMIT", "?"),
               qkv_ar_tiles=a.qkv_ar_tiles)
    res = []
    for dtype in a.dtypes.split(","):
        res.append(run(dtype, a, text))
        r = res[-1]
        m = r.get("ar_step_margins", [])
        print(f"{dtype:9s} host ar first diff from device ar: {r['ar_host_equal']}")
        for mode in ("sd-naive", "ssv strict"):
            d = r[mode]["first_diff"]
            print(f"{dtype:9s} {mode:11s} first diff {d}  ar step margin there "
                  f"{m[d] if d is not None and d < len(m) else '-'}", flush=True)
        json.dump(dict(env=env, family=a.family, context=a.context, runs=res), open(a.out, "w"))
    # the fp32 margins at bf16's divergence point: how close a tie it was in exact arithmetic
    if len(res) == 2 and res[0]["ar"][:8] == res[1]["ar"][:8]:
        for mode in ("sd-naive", "ssv strict"):
            d = res[0][mode]["first_diff"]
            if d is not None and d < len(res[1].get("ar_step_margins", [])):
                print(f"bf16 {mode} diverged at {d}: fp32 ar margin there {res[1]['ar_step_margins'][d]:.3f}")


if __name__ == "__main__":
    main()
