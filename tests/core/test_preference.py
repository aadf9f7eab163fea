"""Hand-computed Bradley-Terry loss (float64)."""

import math

import pytest
import torch

from lit_rl.core.preference import bradley_terry_loss


def _sp(x):
    return math.log1p(math.exp(x))


def test_bradley_terry_hand_computed_loss_gradient_and_metrics():
    rc = torch.tensor([1.0, 0.0], dtype=torch.float64, requires_grad=True)
    rr = torch.tensor([0.0, 2.0], dtype=torch.float64, requires_grad=True)
    loss, m = bradley_terry_loss(rc, rr)
    # gaps 1 and -2: L = (softplus(-1) + softplus(2)) / 2
    assert float(loss) == pytest.approx((_sp(-1.0) + _sp(2.0)) / 2, rel=1e-12)
    assert m == {"accuracy": 0.5, "margin_mean": -0.5}
    loss.backward()
    # dL/dr_c = -sigmoid(-gap) / P
    sig = [1 / (1 + math.exp(1.0)), 1 / (1 + math.exp(-2.0))]
    assert rc.grad.tolist() == pytest.approx([-sig[0] / 2, -sig[1] / 2], rel=1e-12)
    assert rr.grad.tolist() == pytest.approx([sig[0] / 2, sig[1] / 2], rel=1e-12)


def test_bradley_terry_margin_and_ties():
    rc = torch.tensor([1.0, 3.0], dtype=torch.float64)
    rr = torch.tensor([1.0, 0.5], dtype=torch.float64)
    loss, m = bradley_terry_loss(rc, rr, torch.tensor([0.5, 0.5], dtype=torch.float64))
    assert float(loss) == pytest.approx((_sp(0.5) + _sp(-2.0)) / 2, rel=1e-12)
    assert m["accuracy"] == 0.5  # the tie counts as wrong


def test_bradley_terry_loop_equals_vectorised():
    g = torch.Generator().manual_seed(0)
    rc, rr = (
        torch.randn(7, generator=g, dtype=torch.float64),
        torch.randn(7, generator=g, dtype=torch.float64),
    )
    loop = sum(-math.log(1 / (1 + math.exp(-(a - b)))) for a, b in zip(rc.tolist(), rr.tolist())) / 7
    assert float(bradley_terry_loss(rc, rr)[0]) == pytest.approx(loop, rel=1e-12)


@pytest.mark.parametrize(
    "rc, rr, match",
    [
        (torch.zeros(2), torch.zeros(3), r"r_chosen shape \(2,\) and r_rejected shape \(3,\)"),
        (torch.zeros(0), torch.zeros(0), "no pairs"),
        (torch.tensor([float("nan")]), torch.zeros(1), "r_chosen holds NaN"),
    ],
)
def test_bradley_terry_bad_input(rc, rr, match):
    with pytest.raises(ValueError, match=match):
        bradley_terry_loss(rc, rr)
