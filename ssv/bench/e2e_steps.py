"""The Llama-3.1-8B-shape step table of `ssv bench e2e` (random bf16 weights, CUDA graphs).

Rows (shape, context, step, ms): `ar-nsa` and `ar dense` are the engine's graphed AR step (commit
included); `sd-naive`, `ssv strict`, `ssv approx C16` and `verify dense` are one 48-node target
verify pass (the plan's metadata + the forward) replayed from a graph; `dense bytes floor` is the
weights plus the AR step's K/V read once at the copy bandwidth measured in the same run. The cache
holds random keys (no prefill): routing of random activations selects blocks with no overlap
between queries (rows `... no overlap`: what grouping costs without its benefit). So the NSA verify
rows are also timed with selections whose adjacent-query overlap matches the default model's
recorded routing (Jaccard 0.82 on average over layers, bench/results/kernels-traces-v5-dcbd9d3.json):
routing still runs at every refresh layer (its time counted), then the verify reads those
selections instead of its output (`RecordedSelections`).
"""
from __future__ import annotations

import sys

import torch

from ssv.attention import VerifyOptions
from ssv.attention_device import device_plan
from ssv.config import ModelConfig, RopeConfig
from ssv.engine.device_round import DeviceEngine
from ssv.engine.runner import Runner

LLAMA8B = ModelConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336, n_layers=32, n_heads=32,
                      n_kv_heads=8, head_dim=128, max_seq_len=131072 + 512,
                      rope=RopeConfig(theta=500000.0, scaling="llama3", factor=8.0))
# the default model's shape: its steps timed without the checkpoint (which a device call must carry in parts)
SMOLLM2 = ModelConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, n_layers=30, n_heads=9,
                      n_kv_heads=3, head_dim=64, max_seq_len=16384 + 256, rope=RopeConfig(theta=100000.0),
                      tie_embeddings=True)
SHAPES = {"llama3.1-8b": LLAMA8B, "smollm2-135m": SMOLLM2}


def random_model(cfg: ModelConfig):
    from ssv.model import Transformer
    from ssv.model.layers import rope_inv_freq
    with torch.device("meta"):
        m = Transformer(cfg).to(torch.bfloat16)
    m = m.to_empty(device="cuda").eval()
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0.0, 0.02) if p.dim() > 1 else p.fill_(1.0)
    m.inv_freq = rope_inv_freq(cfg.head_dim, cfg.rope).cuda()
    return m


def fill_cache(runner: Runner, context: int, gen: torch.Generator) -> None:
    """Random committed keys/values (what a prefill leaves, minus its cost) and their compressed blocks."""
    c = runner.cache
    for layer in range(c.k.shape[0]):
        c.k[layer, :, :context].normal_(generator=gen)
        c.v[layer, :, :context].normal_(generator=gen)
    c.length = 0
    c.n_cmp = 0
    if c.nsa is not None:  # layer by layer: the host update's fp32 windows of all layers at once would not fit
        k_all, v_all, kc, vc = c.k, c.v, c.k_cmp, c.v_cmp
        for layer in range(k_all.shape[0]):
            c.k, c.v, c.k_cmp, c.v_cmp = k_all[layer:layer + 1], v_all[layer:layer + 1], kc[layer:layer + 1], vc[layer:layer + 1]
            c.length, c.n_cmp = context, 0
            c._update_compressed()
        c.k, c.v, c.k_cmp, c.v_cmp = k_all, v_all, kc, vc
    c.length = context
    c.sync_device()


def capture_graph(fn, before=None) -> torch.cuda.CUDAGraph:
    """fn captured as one CUDA graph, after two eager warm-ups (compiles, lazy buffers) on a side
    stream; before() runs ahead of each warm-up (a state reset)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            (before or (lambda: None))()
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g


def replay_ms(g: torch.cuda.CUDAGraph, before=None) -> float:
    """One replay of g in ms, CUDA-event timed (before() runs ahead, untimed)."""
    (before or (lambda: None))()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    g.replay()
    b.record()
    b.synchronize()
    return a.elapsed_time(b)


def time_graph(fn, reps: int = 20, before=None) -> float:
    """Median ms of fn captured as one CUDA graph, CUDA-event timed."""
    g = capture_graph(fn, before)
    times = sorted(replay_ms(g, before) for _ in range(reps))
    return times[len(times) // 2]


RECORDED_OVERLAP = 0.82   # mean adjacent-query Jaccard overlap of the default model's recorded routing


def recorded_selections(plan, indices: torch.Tensor):
    """`plan` (a KernelNSAPlan) whose verify reads `indices` [N, Hkv, n] instead of its routing's
    output; routing still runs where the plan refreshes."""
    class RecordedSelections(type(plan)):
        _indices = property(lambda self: indices, lambda self, value: None)
    plan.__class__ = RecordedSelections
    return plan


def synthetic_tree(n: int, gen: torch.Generator, device):
    """An EAGLE-like tree of n nodes (depth <= 7): positions offsets and the ancestor mask."""
    from ssv.bench.synthetic import eagle_tree
    depth, mask = eagle_tree(n, gen)
    return depth.to(device), mask.to(device)


@torch.no_grad()   # the fused layers run only without autograd (they have no backward)
def run_steps(contexts, rows: list, save=None, shape: str = "llama3.1-8b") -> list:
    """Append the table's rows for each context to `rows` (save() after each context)."""
    from ssv.bench.env import copy_bandwidth
    cfg = SHAPES[shape]
    if max(contexts) + 256 > cfg.max_seq_len:
        raise ValueError(f"--steps: {shape} is timed up to {cfg.max_seq_len - 256} tokens, got {max(contexts)}")
    bw = copy_bandwidth()
    model = random_model(cfg)
    w_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    gen = torch.Generator(device="cuda").manual_seed(0)
    n_tree = 48
    for ctx in contexts:
        depth, mask = synthetic_tree(n_tree, torch.Generator().manual_seed(ctx), "cuda")
        tokens = torch.randint(0, cfg.vocab_size, (n_tree,), device="cuda")
        kv_bytes = 2 * cfg.n_layers * cfg.n_kv_heads * ctx * cfg.head_dim * 2
        rows.append({"shape": shape, "context": ctx, "step": "dense bytes floor",
                     "ms": (w_bytes + kv_bytes) / bw / 1e9, "copy_tbps": bw})
        for att in ("nsa", "dense"):
            runner = Runner(model, attention=att, max_len=ctx + 256)
            fill_cache(runner, ctx, gen)
            eng = DeviceEngine(runner)
            dlen0 = runner.cache.dlen.clone()
            reset = lambda: runner.cache.dlen.copy_(dlen0)  # noqa: E731 -- each AR step commits one token
            try:
                ms = time_graph(eng._ar_body, before=reset)
                rows.append({"shape": shape, "context": ctx, "step": f"ar {att}" if att == "dense" else "ar-nsa",
                             "ms": ms})
            except Exception as e:  # noqa: BLE001
                print(f"ar {att} at {ctx}: {type(e).__name__}: {e}", file=sys.stderr)
            verifies = ({"verify dense": VerifyOptions()} if att == "dense" else
                        {"sd-naive": VerifyOptions(1), "ssv strict": VerifyOptions(4),
                         "ssv approx C16": VerifyOptions(16, "approx")})
            sel, ov = None, None
            if att == "nsa":
                from ssv.bench.synthetic import overlap_of, synthetic_selection
                # keeping each of f free blocks with probability p beside F shared forced ones gives
                # adjacent Jaccard J = (F + p f) / (F + 2 f - p f); solved for p (the row reports J)
                F, J = 3, RECORDED_OVERLAP
                f = runner.nsa.n_select - F
                keep = min(1.0, max(0.0, (J * (F + 2 * f) - F) / (f * (1 + J))))
                sel = synthetic_selection((ctx + depth).cpu(), cfg.n_kv_heads, runner.nsa, keep,
                                          torch.Generator().manual_seed(ctx))
                ov = overlap_of(sel)
                sel = sel.to(device="cuda", dtype=torch.int32)
                verifies = {**{f"{k} no overlap": v for k, v in verifies.items()}, **verifies}
            for name, vo in verifies.items():
                plan = device_plan(att, runner.nsa, vo, n_tree, runner.cache, cfg.n_heads, True)
                extra = {}
                if sel is not None and not name.endswith("no overlap"):
                    plan = recorded_selections(plan, sel)
                    extra = {"selections": "recorded overlap", "overlap": ov}

                def verify(plan=plan):
                    pos = runner.cache.dlen.long() + depth
                    plan.plan(runner.cache.dlen, pos, mask)
                    model(tokens, pos, plan, runner.cache)
                try:
                    rows.append({"shape": shape, "context": ctx, "step": name, "ms": time_graph(verify),
                                 "tree_tokens": n_tree, **extra})
                except Exception as e:  # noqa: BLE001
                    print(f"{name} at {ctx}: {type(e).__name__}: {e}", file=sys.stderr)
            del runner, eng
            torch.cuda.empty_cache()
        for r in rows:
            if r["context"] == ctx:
                print(f"{shape} {ctx:7d} {r['step']:18s} {r['ms']:8.3f} ms", flush=True)
        if save:
            save()
    return rows
