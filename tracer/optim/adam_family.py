"""Adamax, NAdam and RAdam (`tr.optim`) with PyTorch's update rules in its order of operations,
its state names and its argument checks.

PyTorch keeps NAdam's `mu_product` in its default scalar dtype, float32 (it reads the step as a
Python float, so its step count is exact in any dtype), and its load_state_dict casts it to the
parameter's dtype: ours too, multiplied as PyTorch multiplies it (by mu rounded to its dtype), so
float64 parameters follow PyTorch's to the last bits. RAdam's choice between the rectified and the plain update, a Python `if` on the
step in PyTorch, is a `where` on the step tensor here, so that a traced step makes it every call.
"""
from __future__ import annotations

import builtins
from typing import Iterable

from tracer.arithmetic import where
from tracer.creation import ones, zeros_like
from tracer.errors import ArgumentError
from tracer.ir.types import float32, float64
from tracer.optim.optimizer import (Optimizer, _adam_moments, _gradient, _implementation,
                                    _require_not_negative, _step_count)
from tracer.tensor import Tensor


def _check_adam_arguments(lr: float, betas: tuple[float, float], eps: float,
                          weight_decay: float) -> None:
    _require_not_negative(lr=lr, eps=eps, weight_decay=weight_decay)
    for index, beta in enumerate(betas):
        if not 0.0 <= beta < 1.0:
            raise ArgumentError(f"betas[{index}] must be in [0, 1), got {beta}")


def _moments(parameter: Tensor) -> dict[str, Tensor]:
    return {"step": _step_count(), "exp_avg": zeros_like(parameter),
            "exp_avg_sq": zeros_like(parameter)}


class Adamax(Optimizer):
    """Adam with the infinity norm: the step divided by a decaying maximum of |gradient|."""

    def __init__(self, params: Iterable, lr: float = 2e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0,
                 foreach: builtins.bool | None = None, *, maximize: builtins.bool = False,
                 differentiable: builtins.bool = False, capturable: builtins.bool = False) -> None:
        _check_adam_arguments(lr, betas, eps, weight_decay)
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps,
                                      weight_decay=weight_decay, maximize=maximize,
                                      **_implementation(foreach=foreach,
                                                        differentiable=differentiable,
                                                        capturable=capturable)))

    def _initial_state(self, parameter: Tensor, group: dict) -> dict[str, Tensor]:
        return {"step": _step_count(), "exp_avg": zeros_like(parameter),
                "exp_inf": zeros_like(parameter)}

    def _update(self, parameter: Tensor, grad: Tensor, state: dict, group: dict) -> None:
        beta1, beta2 = group["betas"]
        grad = _gradient(parameter, grad, group)
        step = state["step"].add_(1)
        exp_avg = state["exp_avg"].lerp_(grad, 1 - beta1)
        exp_inf = state["exp_inf"]
        exp_inf.copy_(exp_inf.mul(beta2).maximum(grad.abs() + group["eps"]))
        parameter.addcdiv_(exp_avg, exp_inf, value=-(group["lr"] / (1 - beta1 ** step)))


class NAdam(Optimizer):
    """Adam with Nesterov momentum, the momentum warmed up by `momentum_decay` (and weight decay
    as an L2 term, or decoupled as AdamW's)."""

    def __init__(self, params: Iterable, lr: float = 2e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0, momentum_decay: float = 4e-3,
                 decoupled_weight_decay: builtins.bool = False, *,
                 foreach: builtins.bool | None = None, maximize: builtins.bool = False,
                 capturable: builtins.bool = False, differentiable: builtins.bool = False) -> None:
        _check_adam_arguments(lr, betas, eps, weight_decay)
        _require_not_negative(momentum_decay=momentum_decay)
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps,
                                      weight_decay=weight_decay, momentum_decay=momentum_decay,
                                      decoupled_weight_decay=decoupled_weight_decay,
                                      maximize=maximize,
                                      **_implementation(foreach=foreach, capturable=capturable,
                                                        differentiable=differentiable)))

    def _initial_state(self, parameter: Tensor, group: dict) -> dict[str, Tensor]:
        return dict(_moments(parameter), mu_product=ones((), dtype=float32))

    def _update(self, parameter: Tensor, grad: Tensor, state: dict, group: dict) -> None:
        lr, (beta1, beta2), weight_decay = group["lr"], group["betas"], group["weight_decay"]
        decoupled = group["decoupled_weight_decay"]
        grad = _gradient(parameter, grad, group, l2=not decoupled)
        step = state["step"].add_(1)
        bias_correction2 = 1 - beta2 ** step
        if decoupled and weight_decay != 0:
            parameter.mul_(1 - lr * weight_decay)
        mu = beta1 * (1.0 - 0.5 * 0.96 ** (step * group["momentum_decay"]))
        mu_next = beta1 * (1.0 - 0.5 * 0.96 ** ((step + 1) * group["momentum_decay"]))
        # (PyTorch multiplies by mu rounded to mu_product's dtype: float32, or after a
        # load_state_dict the parameter's)
        mu_product = state["mu_product"]
        mu_product = mu_product.mul_(mu.to(mu_product.dtype)).to(float64)
        exp_avg = state["exp_avg"].lerp_(grad, 1 - beta1)
        exp_avg_sq = state["exp_avg_sq"].mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        denominator = exp_avg_sq.div(bias_correction2).sqrt() + group["eps"]
        parameter.addcdiv_(grad, denominator, value=-lr * (1.0 - mu) / (1.0 - mu_product))
        parameter.addcdiv_(exp_avg, denominator,
                           value=-lr * mu_next / (1.0 - mu_product * mu_next))


class RAdam(Optimizer):
    """Rectified Adam: plain momentum SGD while the variance of the adaptive rate is not yet
    tractable (rho_t <= 5), then Adam's step times the rectification term."""

    def __init__(self, params: Iterable, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0,
                 decoupled_weight_decay: builtins.bool = False, *,
                 foreach: builtins.bool | None = None, maximize: builtins.bool = False,
                 capturable: builtins.bool = False, differentiable: builtins.bool = False) -> None:
        _check_adam_arguments(lr, betas, eps, weight_decay)
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps,
                                      weight_decay=weight_decay,
                                      decoupled_weight_decay=decoupled_weight_decay,
                                      maximize=maximize,
                                      **_implementation(foreach=foreach, capturable=capturable,
                                                        differentiable=differentiable)))

    def _initial_state(self, parameter: Tensor, group: dict) -> dict[str, Tensor]:
        return _moments(parameter)

    def _update(self, parameter: Tensor, grad: Tensor, state: dict, group: dict) -> None:
        lr, (beta1, beta2) = group["lr"], group["betas"]
        step, exp_avg, exp_avg_sq = _adam_moments(parameter, grad, state, group)
        bias_correction2 = 1 - beta2 ** step
        bias_corrected_exp_avg = exp_avg / (1 - beta1 ** step)
        rho_inf = 2 / (1 - beta2) - 1
        rho_t = rho_inf - 2 * step * beta2 ** step / bias_correction2
        rectified = rho_t > 5.0
        # (where rho_t <= 5 the rectification may be the root of a negative number: not taken)
        rectification = ((rho_t - 4) * (rho_t - 2) * rho_inf
                         / ((rho_inf - 4) * (rho_inf - 2) * rho_t)) ** 0.5
        adaptive_lr = bias_correction2 ** 0.5 / (exp_avg_sq.sqrt() + group["eps"])
        # PyTorch's product order, each factor 1 where the update is not rectified
        update = (bias_corrected_exp_avg * lr * where(rectified, adaptive_lr, 1.0)
                  * where(rectified, rectification, 1.0))
        parameter.sub_(update)
