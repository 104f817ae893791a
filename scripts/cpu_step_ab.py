"""In-process A/B of CPU step forms on `make demo`'s job (the default model, its chat prompt): the device round's
phases on the CPU (the 4-node tree's draft, verify and accept bodies, and the AR step) timed with each variant in
turn, alternating in blocks so that the 2-core VM's drift falls on all alike (fresh processes swing the demo's
tok/s by +-15%, more than a few-percent change). A variant file defines VARIANTS = {name: (enter, leave)}: enter()
patches the forms in, leave() restores them (e.g. scripts/cpu_ab_commit.py: the commit's previous tensor form).
    python3 scripts/cpu_step_ab.py VARIANTS.py OUT.json [BLOCKS]
Writes OUT.json (medians and minima in ms, every sample) with the environment and commit."""
from __future__ import annotations

import copy
import json
import statistics
import sys
import time

import torch

from ssv.api import LLM
from ssv.bench.env import environment
from ssv.engine.device_round import DeviceEngine

PROMPT = "Explain in two sentences why the sky is blue."   # the Makefile's PROMPT
BODIES = ("_draft_body", "_verify_body", "_accept_body", "_ar_body")


def capture(llm: LLM) -> dict:
    """Each body's first call of a generation: the engine, its arguments (the round's hand-over dict copied)
    and the device state it advances, so that it can be replayed from the same state."""
    cap, orig = {}, {b: getattr(DeviceEngine, b) for b in BODIES}

    def wrap(name):
        def body(self, *a, **k):
            if name not in cap:
                c, d = self.runner.cache, self.drafter
                a2 = (a[0], copy.deepcopy(a[1])) + tuple(a[2:]) if name != "_ar_body" else a
                state = [c.dlen] + ([d.dlen, d.slot_pos] if d is not None else [])
                cap[name] = (self, a2, k, [(t, t.clone()) for t in state])
            return orig[name](self, *a, **k)
        return body
    for b in BODIES:
        setattr(DeviceEngine, b, wrap(b))
    try:
        llm.generate(PROMPT, mode="ssv", max_new_tokens=16)
        llm.generate(PROMPT, mode="ar", max_new_tokens=4)
    finally:
        for b in BODIES:
            setattr(DeviceEngine, b, orig[b])

    def replay(name):
        eng, a, k, state = cap[name]
        fn = orig[name]

        def run():
            for t, v in state:
                t.copy_(v)
            fn(eng, *copy.copy(a), **k)
        return run
    return {b.strip("_").replace("_body", ""): replay(b) for b in BODIES}


def main() -> None:
    vfile, out = sys.argv[1], sys.argv[2]
    blocks = int(sys.argv[3]) if len(sys.argv) > 3 else 8
    llm = LLM("default")
    runs = capture(llm)
    ns: dict = {"llm": llm}   # a variant may patch the loaded model or head
    exec(compile(open(vfile).read(), vfile, "exec"), ns)
    variants = ns["VARIANTS"]
    res = {(v, p): [] for v in variants for p in runs}
    with torch.inference_mode():   # as a CPU generation runs since session 55 (`ssv.engine.modes.decoding`)
        for _ in range(blocks):
            for v, (enter, leave) in variants.items():
                enter()
                try:
                    for p, fn in runs.items():
                        for _ in range(2):
                            fn()
                        for _ in range(8):
                            t = time.perf_counter()
                            fn()
                            res[(v, p)].append((time.perf_counter() - t) * 1e3)
                finally:
                    leave()
    rows = [dict(variant=v, phase=p, median_ms=statistics.median(x), min_ms=min(x), samples=x)
            for (v, p), x in res.items()]
    print(f"{'phase':8s} " + " ".join(f"{v + ' median / min ms':>28s}" for v in variants))
    for p in runs:
        print(f"{p:8s} " + " ".join(f"{statistics.median(res[(v, p)]):>18.2f} / {min(res[(v, p)]):6.2f}"
                                    for v in variants))
    with open(out, "w") as f:
        json.dump(dict(env=environment("cpu"), variants=vfile, blocks=blocks, prompt=PROMPT, rows=rows), f, indent=1)
    print("wrote", out)


if __name__ == "__main__":
    main()
