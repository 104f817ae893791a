"""The CPU decode step's GEMM forms (ssv/ops/linear/cpu.py) against F.linear, and the layers' dispatch."""
import zlib
from types import SimpleNamespace

import pytest
import torch
from torch.nn import functional as F

import ssv.ops.linear.cpu as cpu
from ssv.model.layers import dense


@pytest.mark.parametrize("form", cpu.FORMS)
@pytest.mark.parametrize("shape", [(1, 576), (2, 33), (3, 64), (4, 7), (5, 96), (8, 17), (2, 3, 40), (1, 1, 64)])
@pytest.mark.parametrize("n", [1, 13, 96])
@pytest.mark.parametrize("bias", [False, True])
def test_cpu_linear_matches_f_linear(form, shape, n, bias):
    g = torch.Generator().manual_seed(zlib.crc32(repr((form, shape, n, bias)).encode()))
    x = torch.randn(*shape, generator=g)
    w = torch.randn(n, shape[-1], generator=g)
    b = torch.randn(n, generator=g) if bias else None
    got = cpu.cpu_linear(x, w, b, form)
    want = F.linear(x.double(), w.double(), None if b is None else b.double()).float()
    assert got.shape == (*shape[:-1], n) and got.is_contiguous() and got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * shape[-1] ** 0.5)


@pytest.mark.parametrize("form", ["transposed", "packed"])
def test_rows_are_independent(form):
    # a NaN row (and the single row's padded copy) must not reach the other rows
    x = torch.randn(3, 64)
    x[1] = float("nan")
    w = torch.randn(40, 64)
    y = cpu.cpu_linear(x, w, form=form)
    assert torch.isnan(y[1]).all() and torch.isfinite(y[[0, 2]]).all()
    torch.testing.assert_close(cpu.cpu_linear(x[:1], w, form=form), y[:1], rtol=1e-5, atol=1e-5)


def test_packed_copies_follow_their_weight():
    # the packed copy is made once per weight, remade when the weight changes in place (an optimizer
    # step, a load into it) and dropped when the weight is freed
    w, x = torch.randn(24, 16), torch.randn(4, 16)
    before = len(cpu._PACKS)
    p1 = cpu.packed_weight(w)
    assert cpu.packed_weight(w) is p1 and len(cpu._PACKS) == before + 1
    torch.testing.assert_close(cpu.cpu_linear(x, w, form="packed"), x @ w.T, rtol=1e-5, atol=1e-5)
    w.mul_(-2.0)
    assert cpu.packed_weight(w) is not p1
    torch.testing.assert_close(cpu.cpu_linear(x, w, form="packed"), x @ w.T, rtol=1e-5, atol=1e-5)
    del w, p1
    assert len(cpu._PACKS) == before


def test_the_packed_form_needs_onednn(monkeypatch):
    monkeypatch.setattr(cpu, "packable", lambda: False)
    assert cpu.available_forms() == ("linear", "transposed")
    monkeypatch.setenv(cpu.ENV, "packed")
    with pytest.raises(ValueError, match="SSV_CPU_GEMM must be one of"):
        cpu.cpu_forms()
    monkeypatch.setenv(cpu.ENV, "")
    got = cpu._calibrate(-1, hidden=32, inter=48, kv=16, layers=1, reps=1)
    assert "packed" not in got


def test_cpu_linear_refuses_bad_input():
    with pytest.raises(ValueError, match="form must be one of"):
        cpu.cpu_linear(torch.zeros(1, 4), torch.zeros(3, 4), form="sgemv")
    with pytest.raises(ValueError, match=r"x \[..., K\] and w \[N, K\]"):
        cpu.cpu_linear(torch.zeros(1, 4), torch.zeros(3, 5), form="transposed")


def test_forms_from_env_and_calibration(monkeypatch):
    for form in cpu.FORMS:
        monkeypatch.setenv(cpu.ENV, form)
        many = "linear" if form == "transposed" else form      # the transposed form never for many rows
        assert cpu.cpu_forms() == (form,) * cpu.MAX_ROWS + (many,)
        assert cpu.cpu_form(1) == form and cpu.cpu_form(cpu.MAX_ROWS + 1) == many == cpu.cpu_form(300)
    monkeypatch.setenv(cpu.ENV, "fast")
    with pytest.raises(ValueError, match="SSV_CPU_GEMM must be one of"):
        cpu.cpu_forms()
    monkeypatch.setenv(cpu.ENV, "")     # unset or empty: auto
    assert cpu.cpu_forms() == cpu._calibrated(torch.get_num_threads())[0]
    # the chosen form's time per probe: what `row_cost` reads (the CPU's tree weighs the 4th row by it)
    costs = cpu._calibrated(torch.get_num_threads())[1]
    assert set(costs) == {m for m, _ in cpu.PROBES} and all(c > 0 for c in costs.values())
    assert cpu.row_cost(4) == costs[4] and cpu.row_cost(5) == costs[6] and cpu.row_cost(cpu.MAX_ROWS + 1) is None
    monkeypatch.setenv(cpu.ENV, "packed")
    assert cpu.row_cost(4) is None   # a fixed form: nothing timed
    monkeypatch.setenv(cpu.ENV, "")
    # the measured choice: a valid form per row count, the same for the rows one probe stands for
    got = cpu._calibrate(torch.get_num_threads(), hidden=64, inter=96, kv=32, layers=1, reps=1)
    assert len(got) == cpu.MAX_ROWS + 1 and set(got) <= set(cpu.FORMS) and got[-1] != "transposed"
    for _, rows in cpu.PROBES:
        assert len({got[r - 1] for r in rows}) == 1


def test_forms_take_turns_and_keep_their_fastest_call(monkeypatch):
    clock = [0.0]
    monkeypatch.setattr(cpu, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    order = []
    durations = {"linear": iter([3.0, 1.0, 2.0]), "transposed": iter([2.5, 2.5, 0.25]), "packed": iter([0.5, 4.0, 0.7])}

    def call(f):
        order.append(f)
        clock[0] += next(durations[f])

    got = cpu._time_forms({f: (lambda f=f: call(f)) for f in durations}, reps=3)
    assert order == ["linear", "transposed", "packed"] * 3     # turns, not one form's reps in a row
    assert got == {"linear": 1.0, "transposed": 0.25, "packed": 0.5}
    # the calibration keeps every form's time per probe beside the chosen one's
    times = cpu._calibrated(torch.get_num_threads())[2]
    assert set(times) == {m for m, _ in cpu.PROBES} | {cpu.MANY_ROWS}
    assert set(times[1]) == set(cpu.available_forms()) and "transposed" not in times[cpu.MANY_ROWS]


def test_calibration_takes_the_fastest_form_only_past_the_margin(monkeypatch):
    assert cpu._choose({"linear": 1.0, "transposed": 0.99 / cpu.MARGIN, "packed": 2.0}) == "transposed"
    assert cpu._choose({"linear": 1.0, "transposed": 1.01 / cpu.MARGIN, "packed": 2.0}) == "linear"
    assert cpu._choose({"linear": 1.0, "transposed": 0.8, "packed": 0.7}) == "packed"
    assert cpu._choose({"linear": 0.5, "transposed": 0.8, "packed": 0.7}) == "linear"
    # the timer replaced: F.linear takes 1.0 at every probe, the other forms what `times` says
    times = {"transposed": {1: 0.5, 2: 0.5, 3: 0.95, 4: 0.3, 6: 2.0, cpu.MANY_ROWS: 0.1},
             "packed": {1: 0.6, 2: 1.5, 3: 0.7, 4: 0.4, 6: 1.01 / cpu.MARGIN, cpu.MANY_ROWS: 0.8}}
    seen = []

    def fake_time(fns, reps):
        out = {}
        for f, fn in fns.items():
            fn()
            out[f] = seen[-1]
        return out

    real = cpu.cpu_linear

    def spy(x, w, b=None, form="linear"):
        seen.append(1.0 if form == "linear" else times[form].get(x.shape[0], 1.0))
        return real(x, w, b, form)

    monkeypatch.setattr(cpu, "_time_forms", fake_time)
    monkeypatch.setattr(cpu, "cpu_linear", spy)
    got = cpu._calibrate(0, hidden=16, inter=32, kv=8, layers=1, reps=1)
    # (many rows: packed, though the transposed form would be faster there: it is never timed for them)
    assert got == ("transposed", "transposed", "packed", "transposed", "linear", "linear", "linear", "linear",
                   "packed")
    times["packed"][cpu.MANY_ROWS] = 1.01 / cpu.MARGIN
    assert cpu._calibrate(0, hidden=16, inter=32, kv=8, layers=1, reps=1)[-1] == "linear"


@pytest.mark.parametrize("form", cpu.FORMS)
def test_dense_dispatch(monkeypatch, form):
    import ssv.model.layers as layers
    monkeypatch.setenv(cpu.ENV, form)
    seen = []
    real = layers.cpu_linear
    monkeypatch.setattr(layers, "cpu_linear", lambda *a: seen.append(a[-1]) or real(*a))
    x, w = torch.randn(3, 32), torch.randn(8, 32)
    with torch.no_grad():
        y = dense(x, w)
        dense(torch.randn(cpu.MAX_ROWS + 1, 32), w)       # past MAX_ROWS: the many-rows form
        dense(x.double(), w.double())                     # not fp32: F.linear
    want = [] if form == "linear" else [form]             # the linear form is F.linear itself
    want += ["packed"] if form == "packed" else []        # (the transposed one is never the many-rows form)
    assert seen == want
    torch.testing.assert_close(y, F.linear(x, w), rtol=1e-5, atol=1e-5)
    # with autograd on (training), always F.linear: the same bits and a gradient
    xg = x.clone().requires_grad_()
    yg = dense(xg, w)
    assert seen == want and torch.equal(yg.detach(), F.linear(x, w))
    yg.sum().backward()
    assert xg.grad is not None


@pytest.mark.parametrize("form", cpu.FORMS)
@pytest.mark.parametrize("variant", ["plain", "bias+tied", "gated"])
def test_model_step_in_either_form_matches_the_reference(monkeypatch, form, variant):
    # a tiny model's AR step and 3-row verify through the eager layers in each form (q/k/v biases, a
    # tied head and gated NSA's g_proj included): the logits of both forms agree to fp32 rounding
    from ..conftest import make_tiny_model

    from ssv.attention import StepMeta
    from ssv.config import NSAConfig
    from ssv.engine.runner import Runner
    kw = {"plain": {}, "bias+tied": dict(attn_bias=True, tie=True),
          "gated": dict(nsa=NSAConfig(gating="gated"))}[variant]
    model = make_tiny_model(3, **kw)
    ids = torch.randint(0, 97, (40,), generator=torch.Generator().manual_seed(1)).tolist()
    out = {}
    for f in ("linear", form):
        monkeypatch.setenv(cpu.ENV, f)
        r = Runner(model, attention="nsa")
        r.prefill(ids[:37])
        logits, _ = r.forward(torch.tensor(ids[37:40]), StepMeta.chain(r.length, 3))
        step, _ = r.forward(torch.tensor(ids[37:38]), StepMeta.chain(r.length, 1))
        out[f] = (logits, step)
    torch.testing.assert_close(out[form][0], out["linear"][0], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(out[form][1], out["linear"][1], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(out[form][1][0], out[form][0][0], rtol=1e-4, atol=1e-4)


def test_a_cpu_runner_times_the_forms_before_any_step(monkeypatch):
    from ..conftest import make_tiny_model

    from ssv.engine.runner import Runner
    monkeypatch.setenv(cpu.ENV, "auto")
    calls = []
    monkeypatch.setattr(cpu, "_calibrated", lambda threads: calls.append(threads) or (("linear",) * (cpu.MAX_ROWS + 1), {}))
    Runner(make_tiny_model(0, n_layers=1), attention="nsa")
    assert calls and set(calls) == {torch.get_num_threads()}


@pytest.mark.parametrize("tie", [False, True])
def test_a_cpu_runner_packs_the_weights_its_steps_read(monkeypatch, tie):
    # with the packed form chosen, every weight a step multiplies (the head's too, the embedding when
    # tied) is packed at construction; with it not chosen, none is
    from ..conftest import make_tiny_model

    from ssv.engine.runner import Runner
    model = make_tiny_model(2, n_layers=2, tie=tie)
    head = model.embed_tokens.weight if tie else model.lm_head.weight
    # a layer's step multiplies by q|k|v and gate|up concatenated, o and down: not by q, k, v, gate, up
    read = [w for blk in model.layers for w in blk.self_attn.cpu_weights() + blk.mlp.cpu_weights()] + [head]
    apart = [m.weight for blk in model.layers for m in (blk.self_attn.q_proj, blk.self_attn.k_proj,
                                                         blk.self_attn.v_proj, blk.mlp.gate_proj, blk.mlp.up_proj)]
    monkeypatch.setenv(cpu.ENV, "transposed")
    Runner(model, attention="nsa")
    assert not any(id(w) in cpu._PACKS for w in read)
    monkeypatch.setenv(cpu.ENV, "packed")
    Runner(model, attention="nsa")
    assert all(cpu._PACKS[id(w)][0]() is w for w in read)
    assert not any(id(w) in cpu._PACKS for w in apart)


@pytest.mark.parametrize("variant", ["plain", "bias+tied", "gated"])
def test_cpu_step_on_concatenated_weights_matches_separate_projections(monkeypatch, variant):
    # the CPU step (q|k|v and gate|up each one GEMM, RoPE over q and k heads at once) against the
    # layers' separate projections, on a prefill, a 3-row verify and an AR step; then a weight
    # changed in place: the concatenation follows it
    from ..conftest import make_tiny_model

    import ssv.model.layers as layers
    from ssv.attention import StepMeta
    from ssv.config import NSAConfig
    from ssv.engine.runner import Runner
    kw = {"plain": {}, "bias+tied": dict(attn_bias=True, tie=True),
          "gated": dict(nsa=NSAConfig(gating="gated"))}[variant]
    model = make_tiny_model(4, **kw)
    ids = torch.randint(0, 97, (41,), generator=torch.Generator().manual_seed(2)).tolist()
    monkeypatch.setenv(cpu.ENV, "transposed")

    def run():
        r = Runner(model, attention="nsa")
        pre, _ = r.prefill(ids[:37])
        ver, _ = r.forward(torch.tensor(ids[37:40]), StepMeta.chain(r.length, 3))
        step, _ = r.forward(torch.tensor(ids[37:38]), StepMeta.chain(r.length, 1))
        return pre, ver, step
    for change in (False, True):
        if change:
            with torch.no_grad():
                model.layers[1].self_attn.k_proj.weight.mul_(-1.5)
                model.layers[0].mlp.up_proj.weight.add_(0.05)
        fused = run()
        monkeypatch.setattr(layers, "cpu_step", lambda x: False)
        apart = run()
        monkeypatch.undo()
        monkeypatch.setenv(cpu.ENV, "transposed")
        for a, b in zip(fused, apart):
            assert torch.isfinite(a).all()
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
        if not change:
            before = fused
    assert not torch.allclose(before[2], fused[2], atol=1e-3)   # the change reached the CPU step


@pytest.mark.parametrize("form", cpu.FORMS)
@pytest.mark.parametrize("spec", [(2, 2, 3), (2, 2, 4), (3, 2, 6)])
def test_strict_rounds_emit_ar_tokens_in_either_form(monkeypatch, form, spec):
    # the CPU's trees (verify passes of 3-6 rows, all within MAX_ROWS) through the device round, and AR
    # steps, with the GEMMs in one form: token for token the same greedy text
    from ssv.engine.device_round import DeviceEngine
    from ssv.engine.generate import generate_ar
    from ssv.engine.runner import Runner
    from ssv.engine.spec import SpecOptions, generate_spec
    from ssv.spec.accept import SamplingParams
    from ssv.spec.tree import TreeSpec

    from ..conftest import make_tiny_model
    from ..engine.test_device_round import NSA, OracleDeviceDrafter
    monkeypatch.setenv(cpu.ENV, form)
    greedy = SamplingParams(temperature=0.0)
    r = Runner(make_tiny_model(1, vocab=64, n_layers=3), attention="nsa", nsa=NSA, max_len=300)
    prompt = torch.randint(0, 64, (45,), generator=torch.Generator().manual_seed(3)).tolist()
    ar = generate_ar(r, prompt, greedy, 40)
    d = OracleDeviceDrafter(ar.token_ids, len(prompt), 64)
    res = generate_spec(r, d, prompt, greedy, 40, opts=SpecOptions(tree=TreeSpec(*spec)), engine=DeviceEngine(r, d))
    assert res.token_ids == ar.token_ids
    assert res.stats["mean_accepted_length"] > 1.3     # rounds accepted drafts, so verify rows were used


def test_calibration_times_the_weights_the_cpu_step_multiplies(monkeypatch):
    # the forms are priced on the shapes of the eager CPU step's GEMMs (q|k|v and gate|up concatenated):
    # MKL's F.linear took a slower kernel at 4 rows on the concatenations than on q, k, v, gate, up apart
    from ssv.config import ModelConfig
    from ssv.model.llama import Transformer
    cfg = ModelConfig(vocab_size=50, hidden_size=64, intermediate_size=96, n_layers=1, n_heads=4, n_kv_heads=2,
                      head_dim=16, max_seq_len=64)
    layer = Transformer(cfg).layers[0]
    with torch.no_grad():
        step = layer.self_attn.cpu_weights()[:2] + layer.mlp.cpu_weights()
    want = sorted(tuple(w.shape) for w in step)
    assert sorted(cpu.layer_shapes(64, 96, 2 * 16)) == want
    timed = []
    real = cpu.cpu_linear

    def spy(x, w, b=None, form="linear"):
        timed.append(tuple(w.shape))
        return real(x, w, b, form)

    monkeypatch.setattr(cpu, "cpu_linear", spy)
    cpu._calibrate(0, hidden=64, inter=96, kv=32, layers=1, reps=1)
    assert set(timed) == set(want)


def test_inference_tensors_have_version_zero_and_pack():
    # a CPU generation runs in inference mode, so a weight cached there (a concatenation) is an inference
    # tensor without a version counter: its packed copy is still made, once, and equals F.linear
    w, x = torch.randn(24, 16), torch.randn(4, 16)
    assert cpu.tensor_version(w) == 0
    w.add_(1.0)
    assert cpu.tensor_version(w) == 1
    with torch.inference_mode():
        wi = torch.cat([w[:12], w[12:]])
    assert wi.is_inference() and cpu.tensor_version(wi) == 0
    p = cpu.packed_weight(wi)
    assert cpu.packed_weight(wi) is p
    torch.testing.assert_close(cpu.cpu_linear(x, wi, form="packed"), x @ w.T, rtol=1e-5, atol=1e-5)
