"""How far a verify pass's root row is from the AR step that decodes the same token, on the GPU in
bf16 (random weights, the SmolLM2 shape, random committed keys): the hidden state after each layer
(taps) and the logits, compared bit for bit and by their largest difference. Variants: the verify
pass at C = 4 (strict) and C = 1 (sd-naive), each with the shipped GEMM table and with q|k|v at the
verify pass's rows in the AR step's 16-row tiles (a `"bm": 16` entry copied from the one-row entry),
so each row's q|k|v would be the AR step's bit for bit. Exploration for strict's bf16 fidelity (#11),
not a benchmark. Writes OUT.json.
    python3 scripts/probe_invariance.py OUT.json [--context 4096] [--tree 48]
"""
from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch

import ssv.ops.linear.policy as policy
from ssv.attention import StepMeta, VerifyOptions
from ssv.bench.e2e_steps import SHAPES, fill_cache, random_model
from ssv.bench.env import environment
from ssv.engine.runner import Runner
from ssv.ops.utils import device_name


def invariant_table(rows: int) -> Path:
    """The shipped table plus q|k|v at `rows` rows in the AR step's tiles (a temporary file)."""
    table = json.loads(policy.TILES.read_text())
    dev = table[device_name(torch.device("cuda"))]
    one = next(k for k in dev if k.startswith("bm16-") and k.endswith("-norm") and "-glu" not in k)
    dev[one.replace("bm16-", f"bm{policy.row_tile(rows)}-", 1)] = dict(dev[one], bm=16)
    f = Path(tempfile.mkdtemp()) / "tiles.json"
    f.write_text(json.dumps(table))
    return f


@torch.no_grad()
def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--context", type=int, default=4096)
    p.add_argument("--tree", type=int, default=48)
    a = p.parse_args()
    cfg = SHAPES["smollm2-135m"]
    model = random_model(cfg)
    runner = Runner(model, attention="nsa", max_len=a.context + 256)
    fill_cache(runner, a.context, torch.Generator(device="cuda").manual_seed(0))
    tokens = torch.randint(0, cfg.vocab_size, (a.tree,), generator=torch.Generator().manual_seed(1))
    taps = tuple(range(cfg.n_layers))
    P = runner.length
    shipped = policy.TILES
    rows = []
    for table in ("shipped", "q|k|v in 16-row tiles"):
        policy.TILES = shipped if table == "shipped" else invariant_table(a.tree)
        ar_logits, ar_taps = runner.forward(tokens[:1], StepMeta.chain(P, 1), taps=taps)
        for c in (4, 1):
            opts = VerifyOptions(group_size=c, precision="strict")
            logits, vtaps = runner.forward(tokens, StepMeta.chain(P, a.tree), opts, taps=taps)
            layers = [dict(layer=i, bitwise=bool(torch.equal(vt[0], at[0])),
                           max_abs=float((vt[0].float() - at[0].float()).abs().max()))
                      for i, (vt, at) in enumerate(zip(vtaps, ar_taps))]
            first = next((x["layer"] for x in layers if not x["bitwise"]), None)
            row = dict(table=table, group_size=c, first_layer_differing=first,
                       logits_bitwise=bool(torch.equal(logits[0], ar_logits[0])),
                       logits_max_abs=float((logits[0] - ar_logits[0]).abs().max()),
                       argmax_equal=bool(logits[0].argmax() == ar_logits[0].argmax()), layers=layers)
            rows.append(row)
            print(f"{table:24s} C={c}: first layer differing {first}, logits max |d| "
                  f"{row['logits_max_abs']:.3g}, bitwise {row['logits_bitwise']}", flush=True)
    policy.TILES = shipped
    doc = dict(env=environment("cuda"), context=a.context, tree=a.tree, shape="smollm2-135m", rows=rows)
    Path(a.out).write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
