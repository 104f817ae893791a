"""x @ w.T for a CPU decode step's few rows, in the form this machine's BLAS streams fastest.

A decode step multiplies 1-8 fp32 rows by every weight, so it is bound by reading the weights. How
fast MKL reads them at that shape depends on the CPU: on the 2-core AMD EPYC (Zen 4) VM of session
24, MKL 2024.2, a SmolLM2-135M step's layer weights (425 MB; 120 GEMMs with q|k|v and gate|up
concatenated) took 33.4 ms at one row (sgemv, ~13 GB/s) and 62.4 ms at three rows as `F.linear`
(x @ w.T), but 15.0 ms (one row padded to two) and 20.6 ms (three) as (w @ x.T).T, an sgemm whose
small side is its N (bench/results/cpu-gemm/gemm-forms-c05e736.json). A single row is
padded to two so that it takes that sgemm, not the sgemv. On the Intel VM of an earlier session the
transposed form was the slower one. So nothing is assumed: `cpu_forms()` times the forms once per
process over weights larger than the last-level cache and keeps another form than F.linear only where
it is clearly faster (`MARGIN`); `SSV_CPU_GEMM=linear|transposed|packed` fixes the choice.

At 3-8 rows even that sgemm computes more than it streams (session 25's AMD VM: 23.3-37.5 ms of
layer GEMMs at 4-6 rows). oneDNN's prepacked weights (`torch.ops.mkldnn`, the form inductor's CPU
backend freezes weights into) took 15.8-18.1 ms at 3-8 rows, so a bigger tree costs little more than
a small one; one row is faster padded in the transposed form
(bench/results/cpu-packed/gemm-forms-154696f.json). Past 8 rows the packed form beat F.linear too
(1.8x at 48 rows, 1.5x at 256: gemm-forms-fda2f50.json), so one probe at `MANY_ROWS` decides every
longer step (prefill chunks, 48-node verify passes). The packed copy is made once per weight
(`packed_weight`) and doubles the memory the weights take.

All forms are fp32 GEMMs with fp32 accumulation: they differ in summation order only.
"""
from __future__ import annotations

import functools
import os
import time
import weakref
from typing import Optional

import torch
from torch.nn import functional as F

FORMS = ("linear", "transposed", "packed")
MAX_ROWS = 8        # rows timed one by one: an AR step and a small tree's verify pass
MANY_ROWS = 64      # the probe standing for every longer step (48-node verify passes, prefill chunks):
                    # F.linear or packed only (the transposed form fell behind F.linear by 16 rows)
MARGIN = 1.03       # another form must be this much faster than F.linear to be chosen. It was 1.1, which
                    # sat on this Intel VM's true ratios (packed 1.09-1.15x F.linear at 4-6 rows, 1.06-1.10x
                    # at 64, every form's time in 12 processes): the form flipped from one process to the
                    # next (4 rows F.linear in 3 of 12, longer steps in 8 of 12), costing a 2K round ~7%.
                    # Interleaved minima spread ~3% (bench/NOTES.md, session 39)
# the row counts timed, each standing for a range: one row (the AR step, padded to two), two (where
# the transposed form is fastest), three, four (where MKL's F.linear changed kernels on an Intel VM,
# which decides the CPU's tree), 5-8
PROBES = ((1, (1,)), (2, (2,)), (3, (3,)), (4, (4,)), (6, (5, 6, 7, 8)))
PACK_ROWS = 4       # oneDNN's batch hint for the packed layout: a small verify pass's rows
ENV = "SSV_CPU_GEMM"


def packable() -> bool:
    """Whether this torch build has oneDNN's prepacked linear (CPU builds do)."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")


def available_forms() -> tuple:
    return FORMS if packable() else FORMS[:2]


# id(weight) -> (weakref, version, packed copy). A memo, not state: an entry is rebuilt when its
# weight changes in place (the version counter) and dropped when its weight is freed.
_PACKS: dict = {}


def tensor_version(t: torch.Tensor) -> int:
    """t's in-place version counter, 0 for an inference tensor (it has none: one made in a generation's
    inference mode, e.g. a cached concatenation, is never changed in place again)."""
    return 0 if t.is_inference() else t._version


def packed_weight(w: torch.Tensor) -> torch.Tensor:
    """oneDNN's blocked copy of w [N, K] for `_linear_pointwise` (made once per weight and version)."""
    key = id(w)
    e = _PACKS.get(key)
    if e is None or e[0]() is not w or e[1] != tensor_version(w):
        ref = weakref.ref(w, lambda _, key=key: _PACKS.pop(key, None))
        packed = torch.ops.mkldnn._reorder_linear_weight(w.detach(), batch_size=PACK_ROWS)
        e = _PACKS[key] = (ref, tensor_version(w), packed)
    return e[2]


def cpu_linear(x: torch.Tensor, w: torch.Tensor, b: Optional[torch.Tensor] = None,
               form: str = "linear") -> torch.Tensor:
    """x [..., K] @ w.T (+ b) with w [N, K], as F.linear ("linear"), as (w @ x.T).T with a single
    row padded to two ("transposed") or on oneDNN's packed copy of w ("packed"). Returns a contiguous
    [..., N]."""
    if form == "linear":
        return F.linear(x, w, b)
    if form not in FORMS:
        raise ValueError(f"cpu_linear: form must be one of {FORMS}, got {form!r}")
    if x.shape[-1] != w.shape[-1] or w.dim() != 2:
        raise ValueError(f"cpu_linear: x [..., K] and w [N, K] needed, got {tuple(x.shape)} and {tuple(w.shape)}")
    x2 = x.reshape(-1, x.shape[-1])
    m = x2.shape[0]
    if form == "packed":
        y = torch.ops.mkldnn._linear_pointwise(x2.contiguous(), packed_weight(w), b, "none", [], "")
    else:
        y = torch.mm(w, (torch.cat([x2, x2]) if m == 1 else x2).t())   # [N, m or 2]: an sgemm, not MKL's sgemv
        y = y.t()[:m].contiguous()                                    # [m, N]
        if b is not None:
            y += b
    return y if x.dim() == 2 else y.view(*x.shape[:-1], w.shape[0])


def _time_forms(fns: dict, reps: int) -> dict:
    """Each form's fastest of `reps` calls, the forms taking turns. The fastest: a noisy VM only ever
    adds time, and one slow median once put the 1-row step on the packed form, 20% slower (session 25).
    Taking turns: a slow spell of the VM then costs every form alike, where all of one form's reps
    before the next form's could let one spell decide the choice."""
    best = {f: float("inf") for f in fns}
    for _ in range(reps):
        for f, fn in fns.items():
            t = time.perf_counter()
            fn()
            best[f] = min(best[f], time.perf_counter() - t)
    return best


def layer_shapes(hidden: int, inter: int, kv: int) -> list:
    """A transformer layer's weights [N, K] as the eager CPU step multiplies them (`cpu_weights`): q|k|v
    concatenated, o, gate|up concatenated, down (q's width = hidden). MKL's F.linear prices 4 rows by
    the weight's shape: timed on q, k, v, gate and up apart, it kept F.linear at 4 rows (10.0-10.5
    against the packed form's 9.4-12.2 ms), on the step's concatenations it is ~1.2x slower (10.2-10.9
    against 8.7-8.8; bench/results/cpu-s36/calib-shapes.json), as the model's 4-row layer GEMMs are
    (41.3 against 32.4 ms, cpu-s36/gemm-forms-a2bb9b8.json)."""
    return [(hidden + 2 * kv, hidden), (hidden, hidden), (2 * inter, hidden), (hidden, inter)]


def _calibrate(threads: int, hidden: int = 576, inter: int = 1536, kv: int = 192, layers: int = 8,
               reps: int = 4, times: Optional[dict] = None) -> tuple:
    # (threads: the cache key of `_calibrated`; the timing runs on torch's current thread count;
    # times: filled with probe rows (MANY_ROWS too) -> every form's seconds)
    # the default model's layer shapes, `layers` of them (113 MB a form, 3.5x a 32 MB L3) so that each
    # GEMM reads its weights from memory as a step does. Smaller sets ranked the forms wrongly at one
    # row: 12 weights of 1536 x 576, or three layers, put the packed form first where the model's AR
    # step ran 19% slower with it (61.2 against 51.5 ms at 2K, bench/results/cpu-packed/gemm-forms-154696f.json)
    ws = [torch.full(s, 0.01 * (i + 1)) for i in range(layers) for s in layer_shapes(hidden, inter, kv)]
    forms = available_forms()
    for f in forms:    # the packed copies are made outside the timing, as a step's are after its first
        [cpu_linear(torch.zeros(1, w.shape[1]), w, form=f) for w in ws]
    out = {}
    for m, rows in PROBES:
        xs = {k: torch.full((m, k), 0.5) for k in (hidden, inter)}
        t = _time_forms({f: lambda f=f: [cpu_linear(xs[w.shape[1]], w, form=f) for w in ws] for f in forms}, reps)
        for r in rows:
            out[r] = _choose(t)
        if times is not None:
            times[m] = t
    x = {k: torch.full((MANY_ROWS, k), 0.5) for k in (hidden, inter)}
    many = _time_forms({f: lambda f=f: [cpu_linear(x[w.shape[1]], w, form=f) for w in ws]
                        for f in forms if f != "transposed"}, reps)
    if times is not None:
        times[MANY_ROWS] = many
    return tuple(out[r] for r in range(1, MAX_ROWS + 1)) + (_choose(many),)


def _choose(t: dict) -> str:
    """The fastest form by its time, if it beats F.linear's by MARGIN; otherwise F.linear."""
    best = min(t, key=t.get)
    return best if t[best] * MARGIN < t["linear"] else "linear"


@functools.lru_cache(maxsize=None)
def _calibrated(threads: int) -> tuple:
    """(the forms, {probe rows: the chosen form's seconds}, {probe rows: every form's seconds}) of this
    thread count, measured once."""
    times: dict = {}
    with torch.no_grad():
        forms = _calibrate(threads, times=times)
    return forms, {m: times[m][forms[m - 1]] for m, _ in PROBES}, times


def row_cost(rows: int) -> Optional[float]:
    """Seconds of the calibration's layer GEMMs at the probe standing for `rows` rows (1..MAX_ROWS) in
    the form it chose there, or None where `SSV_CPU_GEMM` fixes the forms (nothing is timed then)."""
    if (os.environ.get(ENV) or "auto") != "auto":
        return None
    costs = _calibrated(torch.get_num_threads())[1]
    return next((costs.get(m) for m, rs in PROBES if rows in rs), None)


def prepack(model: torch.nn.Module) -> None:
    """Make the packed copies of a model's decode weights now, outside any timed step: those its
    modules' `cpu_weights` name, the other nn.Linear weights and a tied head's embedding (a no-op
    unless some row count takes the packed form)."""
    p = next(model.parameters(), None)
    if p is None or not uses_forms(p.device, p.dtype) or "packed" not in cpu_forms():
        return
    ws, covered = [], set()
    for mod in model.modules():    # a module that multiplies by other tensors names them (q|k|v, gate|up)
        if hasattr(mod, "cpu_weights") and id(mod) not in covered:
            with torch.no_grad():
                ws += mod.cpu_weights()
            covered.update(id(c) for c in mod.modules())
    ws += [m.weight for m in model.modules() if isinstance(m, torch.nn.Linear) and id(m) not in covered]
    if getattr(model, "lm_head", True) is None:     # a tied head multiplies by the embedding
        ws.append(model.embed_tokens.weight)
    with torch.no_grad():
        for w in ws:
            packed_weight(w)


def cpu_forms() -> tuple:
    """The form per row count 1..MAX_ROWS, then the one for more rows, on this machine: measured once per
    process and thread count, or `SSV_CPU_GEMM` (which makes runs reproducible: the forms round
    differently; a fixed "transposed" leaves longer steps on F.linear)."""
    env = os.environ.get(ENV) or "auto"
    if env == "auto":
        return _calibrated(torch.get_num_threads())[0]
    if env not in available_forms():
        raise ValueError(f"{ENV} must be one of {available_forms() + ('auto',)}, got {env!r}")
    return (env,) * MAX_ROWS + ("linear" if env == "transposed" else env,)


def uses_forms(device, dtype) -> bool:
    """Whether a model on `device` in `dtype` runs its decode GEMMs through these forms (CPU, fp32)."""
    return torch.device(device).type == "cpu" and dtype == torch.float32


def cpu_form(rows: int) -> str:
    return cpu_forms()[min(rows, MAX_ROWS + 1) - 1] if rows >= 1 else "linear"
