"""SAM's two-pass update against steps computed by hand, and its place beside the base optimizer
(schedules, checkpoints, parameters without gradients)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from trainer.sam import DEFAULT_RHO, SAM

A = torch.tensor([[3.0, 1.0], [1.0, 2.0]], dtype=torch.float64)
B = torch.tensor([1.0, -2.0], dtype=torch.float64)


def quadratic(w: torch.Tensor) -> torch.Tensor:
    """L(w) = 1/2 w'Aw - b'w; its gradient is Aw - b."""
    return 0.5 * w @ A @ w - B @ w


def two_scalars(w0=(0.7, -1.3)):
    return [nn.Parameter(torch.tensor(v, dtype=torch.float64)) for v in w0]


def backward_at(params) -> torch.Tensor:
    loss = quadratic(torch.stack(params))
    loss.backward()
    return loss


@pytest.mark.parametrize("adaptive", [False, True])
def test_two_pass_update_equals_the_hand_computed_step(adaptive):
    rho, lrs = 0.3, (0.1, 0.05)
    p = two_scalars()
    opt = SAM(torch.optim.SGD([{"params": [p[0]], "lr": lrs[0]}, {"params": [p[1]], "lr": lrs[1]}]), rho=rho, adaptive=adaptive)
    backward_at(p)
    opt.first_step(zero_grad=True)
    backward_at(p)
    opt.second_step()

    w = torch.tensor([0.7, -1.3], dtype=torch.float64)
    g = A @ w - B
    if adaptive:  # ASAM: e = rho * w^2 g / || |w| g ||
        e = rho * w * w * g / torch.linalg.norm(w.abs() * g)
    else:  # e = rho * g / ||g||, the norm over both parameter groups
        e = rho * g / torch.linalg.norm(g)
    g_adv = A @ (w + e) - B
    expected = w - torch.tensor(lrs, dtype=torch.float64) * g_adv
    assert torch.stack([x.detach() for x in p]).tolist() == pytest.approx(expected.tolist(), rel=1e-12)
    # the update differs from plain SGD's: the gradient was taken at the perturbed point
    plain = w - torch.tensor(lrs, dtype=torch.float64) * g
    assert not torch.allclose(expected, plain)


def test_step_with_closure_equals_the_two_calls_and_returns_the_perturbed_loss():
    a, b = two_scalars(), two_scalars()
    opt_a = SAM(torch.optim.SGD(a, lr=0.1), rho=0.2)
    opt_b = SAM(torch.optim.SGD(b, lr=0.1), rho=0.2)
    for _ in range(3):
        opt_a.zero_grad()
        backward_at(a)
        opt_a.first_step(zero_grad=True)
        backward_at(a)
        opt_a.second_step()

        opt_b.zero_grad()
        before = backward_at(b)

        def closure():
            opt_b.zero_grad()
            return backward_at(b)

        perturbed = opt_b.step(closure)
        assert perturbed.item() > before.item()  # the loss is higher at w + e_w, up the gradient
    assert [x.item() for x in a] == [x.item() for x in b]


def test_rho_zero_is_the_base_optimizer():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    twin = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    twin.load_state_dict(model.state_dict())
    x, y = torch.randn(16, 4), torch.randn(16, 1)
    sam = SAM(torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1), rho=0.0)
    plain = torch.optim.AdamW(twin.parameters(), lr=1e-2, weight_decay=0.1)
    for _ in range(5):
        sam.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()

        def closure():
            sam.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            return loss

        sam.step(closure)
        plain.zero_grad()
        nn.functional.mse_loss(twin(x), y).backward()
        plain.step()
    for p, q in zip(model.parameters(), twin.parameters()):
        assert torch.equal(p, q)


def test_zero_and_missing_gradients_stay_finite():
    used, zero, unused = (nn.Parameter(torch.tensor([1.0, 2.0])) for _ in range(3))
    opt = SAM(torch.optim.SGD([used, zero, unused], lr=0.1), rho=DEFAULT_RHO)

    def loss_fn():
        return (used**2).sum() + 0.0 * zero.sum()  # ``zero`` gets a zero gradient, ``unused`` none

    loss_fn().backward()
    opt.first_step(zero_grad=True)
    assert torch.equal(zero.detach(), torch.tensor([1.0, 2.0])) and unused.grad is None
    loss_fn().backward()
    opt.second_step()
    assert all(torch.isfinite(p).all() for p in (used, zero, unused))
    assert torch.equal(zero.detach(), torch.tensor([1.0, 2.0]))
    assert torch.equal(unused.detach(), torch.tensor([1.0, 2.0]))
    assert not torch.equal(used.detach(), torch.tensor([1.0, 2.0]))

    # every gradient zero: no perturbation (no 0/0), the base step alone
    opt.zero_grad()
    (0.0 * used.sum()).backward()
    before = used.detach().clone()
    opt.first_step()
    assert torch.equal(used.detach(), before)
    opt.second_step()
    assert torch.isfinite(used).all()


def test_schedules_and_checkpoints_are_the_base_optimizers():
    p = two_scalars()
    base = torch.optim.AdamW(p, lr=0.5)
    opt = SAM(base, rho=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 0.5**step)
    for _ in range(2):
        opt.zero_grad()
        backward_at(p)

        def closure():
            opt.zero_grad()
            return backward_at(p)

        opt.step(closure)
        sched.step()
    assert base.param_groups[0]["lr"] == pytest.approx(0.125)
    saved = opt.state_dict()
    assert saved["state"].keys() == base.state_dict()["state"].keys() and "old_p" not in str(saved)

    # a SAM checkpoint loads into the plain optimizer, and back into SAM, schedule included
    plain = torch.optim.AdamW(two_scalars(), lr=0.5)
    plain.load_state_dict(saved)
    assert plain.param_groups[0]["lr"] == pytest.approx(0.125)
    again = SAM(torch.optim.AdamW(two_scalars(), lr=0.5), rho=0.1)
    again.load_state_dict(plain.state_dict())
    again.param_groups[0]["lr"] = 0.01
    assert again.base.param_groups[0]["lr"] == 0.01
    assert torch.equal(again.base.state_dict()["state"][0]["exp_avg"], saved["state"][0]["exp_avg"])


def test_bad_arguments():
    with pytest.raises(ValueError, match="rho"):
        SAM(torch.optim.SGD(two_scalars(), lr=0.1), rho=-0.1)
    with pytest.raises(ValueError, match="closure"):
        SAM(torch.optim.SGD(two_scalars(), lr=0.1)).step()
