"""Sharpness-Aware Minimisation (SAM) around any torch optimizer.

Foret et al., "Sharpness-aware minimization for efficiently improving generalization", ICLR 2021:
minimise ``max_{||e||_2 <= rho} L(w + e)``. Each update takes two forward/backward passes on the
same batch: the gradient ``g`` at ``w`` gives the perturbation ``e_w = rho * g / ||g||`` (the norm
over all parameters of all groups); the gradient at ``w + e_w`` is then applied at ``w`` by the
base optimizer. Cacophony (stage 2, section IV-B) trains with rho = 0.075, which doubles the
wall time of a step. ``adaptive=True`` is ASAM's scale-invariant neighbourhood (Kwon et al., ICML
2021): ``e_w = rho * w^2 * g / || |w| * g ||``.

Input: a built optimizer (its param groups, learning rates and schedules stay its own) and the
gradient of the loss at the current weights in ``p.grad``. Output: the base optimizer's step taken
with the gradient at the perturbed weights. ``state_dict`` and ``load_state_dict`` are the base
optimizer's, so a checkpoint loads with or without SAM.

``pytorch-optimizer`` (PyPI) ships an equivalent ``SAM``; it is not used because it takes an
optimizer class rather than a built optimizer, shares its state with the base optimizer, and
would add a collection of about a hundred optimizers to the dependencies for these few lines.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

DEFAULT_RHO = 0.075  # Cacophony, section IV-B: "we use SAM with rho = 0.075"


class SAM(torch.optim.Optimizer):
    """Two-pass SAM update around ``base``.

    Use either ``first_step()`` / (forward, backward at the perturbed weights) / ``second_step()``,
    or ``step(closure)`` where ``closure`` zeroes the gradients, recomputes the loss on the same
    batch, calls ``backward`` and returns the loss. In both forms the gradient at the current
    weights must already be in ``p.grad``. Parameters without a gradient are neither perturbed
    nor restored.
    """

    def __init__(self, base: torch.optim.Optimizer, rho: float = DEFAULT_RHO, adaptive: bool = False, eps: float = 1e-12):
        if rho < 0:
            raise ValueError(f"SAM: rho must be non-negative, got {rho}")
        super().__init__([{"params": g["params"]} for g in base.param_groups], {})
        self.base, self.rho, self.adaptive, self.eps = base, float(rho), bool(adaptive), float(eps)
        self.param_groups = base.param_groups  # the same dicts: lr schedules reach the base optimizer
        self._saved: dict[torch.Tensor, torch.Tensor] = {}  # parameter -> its weights before e_w

    def _with_grad(self) -> list[torch.Tensor]:
        return [p for g in self.param_groups for p in g["params"] if p.grad is not None]

    @torch.no_grad()
    def first_step(self, zero_grad: bool = False) -> None:
        """Move every parameter with a gradient to ``w + e_w`` and remember ``w``."""
        params = self._with_grad()
        if not params:
            return
        device = params[0].device
        scaled = [(p.abs() * p.grad if self.adaptive else p.grad).norm(2).to(device) for p in params]
        scale = self.rho / (torch.stack(scaled).norm(2) + self.eps)
        for p in params:
            self._saved[p] = p.detach().clone()  # restored by copy, exactly, not by subtracting e_w
            p.add_((p.square() if self.adaptive else 1.0) * p.grad * scale.to(p.device, p.dtype))
        if zero_grad:
            self.zero_grad(set_to_none=True)

    @torch.no_grad()
    def second_step(self, zero_grad: bool = False) -> None:
        """Return every parameter to ``w`` and take the base optimizer's step with the gradient
        now in ``p.grad`` (the one at ``w + e_w``)."""
        for p, w in self._saved.items():
            p.copy_(w)
        self._saved.clear()
        self.base.step()
        if zero_grad:
            self.zero_grad(set_to_none=True)

    @torch.no_grad()
    def step(self, closure: Callable[[], torch.Tensor] | None = None) -> torch.Tensor:
        """One SAM update; returns the closure's loss (the loss at ``w + e_w``)."""
        if closure is None:
            raise ValueError("SAM.step needs a closure that recomputes the loss and its gradients")
        self.first_step(zero_grad=True)
        with torch.enable_grad():
            loss = closure()
        self.second_step()
        return loss

    def state_dict(self) -> dict:
        return self.base.state_dict()

    def load_state_dict(self, state_dict: dict) -> None:
        self.base.load_state_dict(state_dict)
        self.param_groups = self.base.param_groups  # loading replaces the base's group list
