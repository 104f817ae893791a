"""The CPU decode step's GEMM forms (ssv/ops/linear/cpu.py) against F.linear, and the layers' dispatch."""
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
    g = torch.Generator().manual_seed(hash((form, shape, n, bias)) % 2**31)
    x = torch.randn(*shape, generator=g)
    w = torch.randn(n, shape[-1], generator=g)
    b = torch.randn(n, generator=g) if bias else None
    got = cpu.cpu_linear(x, w, b, form)
    want = F.linear(x.double(), w.double(), None if b is None else b.double()).float()
    assert got.shape == (*shape[:-1], n) and got.is_contiguous() and got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * shape[-1] ** 0.5)


def test_transposed_rows_are_independent():
    # a NaN row (and the single row's padded copy) must not reach the other rows
    x = torch.randn(3, 64)
    x[1] = float("nan")
    w = torch.randn(40, 64)
    y = cpu.cpu_linear(x, w, form="transposed")
    assert torch.isnan(y[1]).all() and torch.isfinite(y[[0, 2]]).all()
    torch.testing.assert_close(cpu.cpu_linear(x[:1], w, form="transposed"), y[:1], rtol=1e-5, atol=1e-5)


def test_cpu_linear_refuses_bad_input():
    with pytest.raises(ValueError, match="form must be one of"):
        cpu.cpu_linear(torch.zeros(1, 4), torch.zeros(3, 4), form="sgemv")
    with pytest.raises(ValueError, match=r"x \[..., K\] and w \[N, K\]"):
        cpu.cpu_linear(torch.zeros(1, 4), torch.zeros(3, 5), form="transposed")


def test_forms_from_env_and_calibration(monkeypatch):
    for form in cpu.FORMS:
        monkeypatch.setenv(cpu.ENV, form)
        assert cpu.cpu_forms() == (form,) * cpu.MAX_ROWS
        assert cpu.cpu_form(1) == form and cpu.cpu_form(cpu.MAX_ROWS + 1) == "linear"
    monkeypatch.setenv(cpu.ENV, "fast")
    with pytest.raises(ValueError, match="SSV_CPU_GEMM must be one of"):
        cpu.cpu_forms()
    monkeypatch.setenv(cpu.ENV, "auto")
    # the measured choice: a valid form per row count, the same for the rows one probe stands for
    got = cpu._calibrate(torch.get_num_threads(), n=256, k=64, mats=2, reps=1)
    assert len(got) == cpu.MAX_ROWS and set(got) <= set(cpu.FORMS)
    for _, rows in cpu.PROBES:
        assert len({got[r - 1] for r in rows}) == 1


@pytest.mark.parametrize("form", cpu.FORMS)
def test_dense_dispatch(monkeypatch, form):
    monkeypatch.setenv(cpu.ENV, form)
    seen = []
    real = cpu.cpu_linear
    monkeypatch.setattr(cpu, "cpu_linear", lambda *a: seen.append(a[-1]) or real(*a))
    x, w = torch.randn(3, 32), torch.randn(8, 32)
    with torch.no_grad():
        y = dense(x, w)
        dense(torch.randn(cpu.MAX_ROWS + 1, 32), w)       # past MAX_ROWS: F.linear
        dense(x.double(), w.double())                     # not fp32: F.linear
    assert seen == [form]
    torch.testing.assert_close(y, F.linear(x, w), rtol=1e-5, atol=1e-5)
    # with autograd on (training), always F.linear: the same bits and a gradient
    xg = x.clone().requires_grad_()
    yg = dense(xg, w)
    assert seen == [form] and torch.equal(yg.detach(), F.linear(x, w))
    yg.sum().backward()
    assert xg.grad is not None


@pytest.mark.parametrize("form", cpu.FORMS)
def test_model_step_in_either_form_matches_the_reference(monkeypatch, form):
    # a tiny model's AR step and 3-row verify through the eager layers in each form: the logits of
    # both forms agree to fp32 rounding (so greedy picks the same token away from exact ties)
    from ssv.attention import StepMeta
    from ssv.config import ModelConfig
    from ssv.engine.runner import Runner
    from ssv.model.llama import Transformer
    cfg = ModelConfig(vocab_size=97, hidden_size=64, intermediate_size=96, n_layers=2, n_heads=4, n_kv_heads=2,
                      head_dim=16, max_seq_len=256)
    torch.manual_seed(0)
    model = Transformer(cfg).eval()
    ids = torch.randint(0, 97, (40,)).tolist()
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
    from ssv.config import ModelConfig
    from ssv.engine.runner import Runner
    from ssv.model.llama import Transformer
    monkeypatch.setenv(cpu.ENV, "auto")
    calls = []
    monkeypatch.setattr(cpu, "_calibrate", lambda threads: calls.append(threads) or ("linear",) * cpu.MAX_ROWS)
    cfg = ModelConfig(vocab_size=50, hidden_size=32, intermediate_size=48, n_layers=1, n_heads=2, n_kv_heads=1,
                      head_dim=16, max_seq_len=64)
    Runner(Transformer(cfg).eval(), attention="nsa")
    assert calls == [torch.get_num_threads()]
