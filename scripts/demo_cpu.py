"""`make demo`'s job timed: `ssv generate` on its prompt with --mode ar and --mode ssv, alternating,
REPEATS times each (fresh processes, so each pays its own load; tok/s covers decoding only). Writes
OUT.json (bench/results/demo-cpu.json) with the tok/s and mean accepted length of every run.
    python3 scripts/demo_cpu.py [OUT.json] [REPEATS] [VARIANT ...]
A VARIANT is more `--mode ssv` arguments, timed as one more mode in each alternation (e.g. "--lookup 0").
`SSV_CPU_GEMM` fixes the GEMM form of every process (else each one calibrates its own).
"""
from __future__ import annotations

import datetime
import json
import os
import shlex
import subprocess
import sys

PROMPT = "Explain in two sentences why the sky is blue."   # the Makefile's PROMPT


def run(mode: str, extra: str = "", prompt: str = PROMPT, new: int = 48) -> dict:
    """One `ssv generate --chat --json` process (scripts/chat_mal_cpu.py runs it on other questions)."""
    cmd = [sys.executable, "-m", "ssv", "generate", "--model", "default", "--attention", "nsa", "--mode", mode,
           "--chat", "--max-new-tokens", str(new), "--prompt", prompt, "--json", *shlex.split(extra)]
    out = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    st = out["stats"]
    return dict(mode=f"{mode} {extra}".strip(), tokens_per_second=st["tokens_per_second"],
                mean_accepted_length=st.get("mean_accepted_length", 1.0), rounds=st.get("rounds"),
                ar_steps=(st.get("fallback") or {}).get("ar_steps"),
                token_ids=out["token_ids"])


def main(out: str, repeats: int, variants: tuple = ()) -> None:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    runs = []
    for i in range(repeats):
        for mode, extra in [("ar", ""), ("ssv", "")] + [("ssv", v) for v in variants]:
            r = run(mode, extra)
            runs.append(dict(run=i + 1, **r))
            print(f"{r['mode']:16s} {r['tokens_per_second']:6.2f} tok/s  MAL {r['mean_accepted_length']:.2f}  "
                  f"AR steps {r['ar_steps']}", flush=True)
    ids = {json.dumps(r["token_ids"]) for r in runs}
    env = dict(device="cpu (2 threads)", date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               commit=commit or "?", cpu_gemm=os.environ.get("SSV_CPU_GEMM", "calibrated per process"))
    json.dump(dict(env=env, command=f"ssv generate --model default --attention nsa --mode {{ar,ssv}} --chat "
                   f"--max-new-tokens 48 --prompt '{PROMPT}' --json (make demo's prompt), runs alternating ar, ssv"
                   + "".join(f", ssv {v}" for v in variants),
                   identical_tokens=len(ids) == 1, runs=runs), open(out, "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "bench/results/demo-cpu.json", int(sys.argv[2]) if len(sys.argv) > 2 else 2,
         tuple(sys.argv[3:]))
