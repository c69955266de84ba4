"""Adadelta, Rprop and ASGD (`tr.optim`) with PyTorch's update rules in its order of operations,
its state names and its argument checks.

PyTorch makes Rprop's step sizes and ASGD's eta from the learning rate at the first step (a
scheduler may have changed it since the optimizer was made): ours, made with the optimizer, take
it at the first step too, chosen by the step count, which a traced step reads. ASGD's eta and mu
are float32 as PyTorch's (its default scalar dtype; its load_state_dict casts them to the
parameter's) and round as PyTorch's do; its Python `if mu != 1` is a `where` here.
"""
from __future__ import annotations

import builtins
from typing import Iterable

from tracer.arithmetic import where
from tracer.creation import full, full_like, ones, zeros_like
from tracer.errors import ArgumentError
from tracer.ir.types import float32, float64
from tracer.optim.optimizer import (Optimizer, _gradient, _implementation, _require_not_negative,
                                    _step_count)
from tracer.tensor import Tensor


class Adadelta(Optimizer):
    """Adadelta: the gradient scaled by the ratio of the roots of running means of the squared
    updates and the squared gradients (`rho` their decay), times `lr`."""

    def __init__(self, params: Iterable, lr: float = 1.0, rho: float = 0.9, eps: float = 1e-6,
                 weight_decay: float = 0, foreach: builtins.bool | None = None, *,
                 capturable: builtins.bool = False, maximize: builtins.bool = False,
                 differentiable: builtins.bool = False) -> None:
        _require_not_negative(lr=lr, eps=eps, weight_decay=weight_decay)
        if not 0.0 <= rho <= 1.0:
            raise ArgumentError(f"rho must be in [0, 1], got {rho}")
        super().__init__(params, dict(lr=lr, rho=rho, eps=eps, weight_decay=weight_decay,
                                      maximize=maximize,
                                      **_implementation(foreach=foreach, capturable=capturable,
                                                        differentiable=differentiable)))

    def _initial_state(self, parameter: Tensor, group: dict) -> dict[str, Tensor]:
        return {"step": _step_count(), "square_avg": zeros_like(parameter),
                "acc_delta": zeros_like(parameter)}

    def _update(self, parameter: Tensor, grad: Tensor, state: dict, group: dict) -> None:
        rho, eps = group["rho"], group["eps"]
        state["step"].add_(1)
        grad = _gradient(parameter, grad, group)
        square_avg = state["square_avg"].mul_(rho).addcmul_(grad, grad, value=1 - rho)
        acc_delta = state["acc_delta"]
        delta = (acc_delta + eps).sqrt() / (square_avg + eps).sqrt() * grad
        acc_delta.mul_(rho).addcmul_(delta, delta, value=1 - rho)
        parameter.add_(delta, alpha=-group["lr"])


class Rprop(Optimizer):
    """Resilient backpropagation: each element moves by its own step size against the sign of
    its gradient; the step size grows by etas[1] while the sign stays, shrinks by etas[0] (and
    the move is skipped) when it flips, within `step_sizes`."""

    def __init__(self, params: Iterable, lr: float = 1e-2, etas: tuple[float, float] = (0.5, 1.2),
                 step_sizes: tuple[float, float] = (1e-6, 50), *,
                 capturable: builtins.bool = False, foreach: builtins.bool | None = None,
                 maximize: builtins.bool = False, differentiable: builtins.bool = False) -> None:
        _require_not_negative(lr=lr)
        if not 0.0 < etas[0] < 1.0 < etas[1]:
            raise ArgumentError(f"etas must be (etaminus, etaplus) with 0 < etaminus < 1 < "
                                f"etaplus, got {etas}")
        super().__init__(params, dict(lr=lr, etas=tuple(etas), step_sizes=tuple(step_sizes),
                                      maximize=maximize,
                                      **_implementation(foreach=foreach, capturable=capturable,
                                                        differentiable=differentiable)))

    def _initial_state(self, parameter: Tensor, group: dict) -> dict[str, Tensor]:
        return {"step": _step_count(), "prev": zeros_like(parameter),
                "step_size": full_like(parameter, group["lr"])}

    def _update(self, parameter: Tensor, grad: Tensor, state: dict, group: dict) -> None:
        (etaminus, etaplus), (smallest, largest) = group["etas"], group["step_sizes"]
        step, prev, step_size = state["step"], state["prev"], state["step_size"]
        if group["maximize"]:
            grad = -grad
        step_size.copy_(where(step == 0, group["lr"], step_size))  # the lr of the first step
        step.add_(1)
        sign = (grad * prev).sign()
        # PyTorch's replacements of the sign, a nan kept
        factor = where(sign > 0, etaplus, where(sign < 0, etaminus, where(sign == 0, 1.0, sign)))
        step_size.mul_(factor).clamp_(smallest, largest)
        grad = where(factor == etaminus, 0.0, grad)
        parameter.addcmul_(grad.sign(), step_size, value=-1)
        prev.copy_(grad)


class ASGD(Optimizer):
    """Averaged SGD: SGD with the step size eta = lr / (1 + lambd * lr * step) ** alpha and the
    parameter shrunk by 1 - lambd * eta, and `ax`, the average of the parameters since step t0."""

    def __init__(self, params: Iterable, lr: float = 1e-2, lambd: float = 1e-4,
                 alpha: float = 0.75, t0: float = 1e6, weight_decay: float = 0,
                 foreach: builtins.bool | None = None, maximize: builtins.bool = False,
                 differentiable: builtins.bool = False, capturable: builtins.bool = False) -> None:
        _require_not_negative(lr=lr, weight_decay=weight_decay)
        super().__init__(params, dict(lr=lr, lambd=lambd, alpha=alpha, t0=t0,
                                      weight_decay=weight_decay, maximize=maximize,
                                      **_implementation(foreach=foreach,
                                                        differentiable=differentiable,
                                                        capturable=capturable)))

    def _initial_state(self, parameter: Tensor, group: dict) -> dict[str, Tensor]:
        return {"step": _step_count(), "eta": full((), group["lr"], dtype=float32),
                "mu": ones((), dtype=float32), "ax": zeros_like(parameter)}

    def _update(self, parameter: Tensor, grad: Tensor, state: dict, group: dict) -> None:
        lr, lambd, alpha = group["lr"], group["lambd"], group["alpha"]
        step, eta, mu, ax = state["step"], state["eta"], state["mu"], state["ax"]
        grad = _gradient(parameter, grad, group)
        eta.copy_(where(step == 0, lr, eta))  # the lr of the first step, rounded to eta's dtype
        step.add_(1)
        eta_value = eta.to(float64)
        parameter.mul_(1 - lambd * eta_value)
        parameter.add_(grad, alpha=-eta_value)
        ax.copy_(where(mu != 1, ax + (parameter - ax) * mu, parameter))
        # rounded to float32 as PyTorch's torch.as_tensor rounds them, whatever their own dtype
        # (float32, or after a load_state_dict the parameter's)
        eta.copy_((lr / (1 + lambd * lr * step) ** alpha).to(float32))
        mu.copy_((1 / (step - group["t0"]).clamp(min=1)).to(float32))
