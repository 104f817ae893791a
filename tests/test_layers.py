"""The CPU's inference linear (x @ a cached contiguous W.T): the same values as F.linear, autograd kept."""
import pytest
import torch
import torch.nn.functional as F

from ssv.model.layers import linear


@pytest.mark.parametrize("rows", [1, 2, 3, 17])
@pytest.mark.parametrize("bias", [False, True])
def test_linear_equals_f_linear(rows, bias):
    gen = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 40, generator=gen)
    w = torch.randn(24, 40, generator=gen)
    b = torch.randn(24, generator=gen) if bias else None
    with torch.no_grad():
        y = linear(x, w, b)
    want = F.linear(x.double(), w.double(), None if b is None else b.double()).float()
    assert y.shape == (rows, 24) and y.is_contiguous()
    assert torch.allclose(y, want, rtol=1e-5, atol=1e-5)
    # viewed as heads right after, as the attention does
    assert y.view(rows, 4, 6).shape == (rows, 4, 6)


def test_linear_keeps_autograd_and_other_shapes():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(5, 8, generator=gen).requires_grad_()
    w = torch.randn(3, 8, generator=gen).requires_grad_()
    y = linear(x, w)   # grad enabled: F.linear, so the backward is torch's
    y.sum().backward()
    # fp32 tolerances: a column sum near zero cancels (allclose's atol 1e-8 failed on one of them, unseeded)
    torch.testing.assert_close(w.grad, x.detach().sum(0).expand(3, 8))
    with torch.no_grad():
        x3 = torch.randn(2, 5, 8)
        assert torch.allclose(linear(x3, w.detach()), F.linear(x3, w.detach()))


def test_linear_follows_an_updated_weight():
    """The cached transpose is re-made when the weight is modified in place (a trained weight)."""
    w, x = torch.randn(7, 5), torch.randn(4, 5)
    with torch.no_grad():
        a = linear(x, w)
        w.mul_(2.0)
        b = linear(x, w)
    assert torch.allclose(b, 2 * a, atol=1e-5) and torch.allclose(b, F.linear(x, w), atol=1e-5)
