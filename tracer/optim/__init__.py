"""`tr.optim`: SGD, Adam, AdamW, RMSprop and Adagrad with PyTorch's update rules, in PyTorch's
order of operations; Adamax, NAdam and RAdam (adam_family.py), Adadelta, Rprop and ASGD
(classic.py); and `tr.optim.lr_scheduler`. The base class, how a traced step updates the state,
and PyTorch's implementation options (foreach, capturable, differentiable, fused): optimizer.py.
"""
from __future__ import annotations

import builtins
from typing import Iterable

from tracer.errors import ArgumentError
from tracer.arithmetic import where
from tracer.creation import full_like, zeros_like
from tracer.tensor import Tensor
from tracer.optim import lr_scheduler  # tr.optim.lr_scheduler, as torch.optim's
from tracer.optim.optimizer import (Optimizer, _adam_moments, _gradient, _implementation,
                                    _require_not_negative, _step_count)
from tracer.optim.adam_family import Adamax, NAdam, RAdam
from tracer.optim.classic import ASGD, Adadelta, Rprop

__all__ = ["Optimizer", "SGD", "Adam", "AdamW", "RMSprop", "Adagrad", "Adamax", "NAdam", "RAdam",
           "Adadelta", "Rprop", "ASGD", "lr_scheduler"]


class SGD(Optimizer):
    """Stochastic gradient descent with momentum, dampening, Nesterov momentum and weight decay."""

    def __init__(self, params: Iterable, lr: float = 1e-3, momentum: float = 0.0,
                 dampening: float = 0.0, weight_decay: float = 0.0,
                 nesterov: builtins.bool = False, maximize: builtins.bool = False, *,
                 foreach: builtins.bool | None = None, differentiable: builtins.bool = False,
                 fused: builtins.bool | None = None) -> None:
        _require_not_negative(lr=lr, momentum=momentum, weight_decay=weight_decay)
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ArgumentError("Nesterov momentum needs a momentum and zero dampening")
        super().__init__(params, dict(lr=lr, momentum=momentum, dampening=dampening,
                                      weight_decay=weight_decay, nesterov=nesterov,
                                      maximize=maximize,
                                      **_implementation(foreach=foreach,
                                                        differentiable=differentiable,
                                                        fused=fused)))

    def _initial_state(self, parameter: Tensor, group: dict) -> dict[str, Tensor]:
        if group["momentum"] == 0:
            return {}
        state = {"momentum_buffer": zeros_like(parameter)}
        if group["dampening"] != 0:  # the first step is told apart by the count
            state["step"] = _step_count()
        return state

    def _complete_state(self) -> None:
        # dampening set after the momentum buffer was made: its first step is behind it
        started = [self.state[p] for g in self.param_groups for p in g["params"]
                   if "momentum_buffer" in self.state[p] and "step" not in self.state[p]]
        super()._complete_state()
        for state in started:
            if "step" in state:
                state["step"].add_(1)

    def _update(self, parameter: Tensor, grad: Tensor, state: dict, group: dict) -> None:
        grad = _gradient(parameter, grad, group)
        momentum = group["momentum"]
        if momentum != 0:
            buffer, dampening = state["momentum_buffer"], group["dampening"]
            # PyTorch's first step sets the buffer to the gradient itself: from a zero buffer,
            # that is the update with no dampening.
            weight = 1
            if dampening != 0:
                weight = where(state["step"] == 0, 1.0, 1 - dampening)
                state["step"].add_(1)
            buffer.mul_(momentum).add_(grad, alpha=weight)
            grad = grad.add(buffer, alpha=momentum) if group["nesterov"] else buffer
        parameter.add_(grad, alpha=-group["lr"])


class Adam(Optimizer):
    """Adam (with `weight_decay` as an L2 term in the gradient, unless `decoupled_weight_decay`:
    AdamW)."""

    def __init__(self, params: Iterable, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, amsgrad: builtins.bool = False,
                 maximize: builtins.bool = False, *, foreach: builtins.bool | None = None,
                 capturable: builtins.bool = False, differentiable: builtins.bool = False,
                 fused: builtins.bool | None = None,
                 decoupled_weight_decay: builtins.bool = False) -> None:
        if not 0.0 <= betas[0] < 1.0 or not 0.0 <= betas[1] < 1.0:
            raise ArgumentError(f"betas must be in [0, 1), got {betas}")
        _require_not_negative(lr=lr, eps=eps, weight_decay=weight_decay)
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps,
                                      weight_decay=weight_decay, amsgrad=amsgrad,
                                      maximize=maximize,
                                      **_implementation(foreach=foreach, capturable=capturable,
                                                        differentiable=differentiable,
                                                        fused=fused),
                                      decoupled_weight_decay=decoupled_weight_decay))

    def _initial_state(self, parameter: Tensor, group: dict) -> dict[str, Tensor]:
        state = {"step": _step_count(), "exp_avg": zeros_like(parameter),
                 "exp_avg_sq": zeros_like(parameter)}
        if group["amsgrad"]:
            state["max_exp_avg_sq"] = zeros_like(parameter)
        return state

    def _update(self, parameter: Tensor, grad: Tensor, state: dict, group: dict) -> None:
        lr, (beta1, beta2) = group["lr"], group["betas"]
        step, exp_avg, exp_avg_sq = _adam_moments(parameter, grad, state, group)
        bias_correction1 = 1 - beta1 ** step
        bias_correction2_sqrt = (1 - beta2 ** step).sqrt()
        second_moment = exp_avg_sq
        if group["amsgrad"]:
            second_moment = state["max_exp_avg_sq"].copy_(
                state["max_exp_avg_sq"].maximum(exp_avg_sq))
        denominator = second_moment.sqrt() / bias_correction2_sqrt + group["eps"]
        parameter.addcdiv_(exp_avg, denominator, value=-(lr / bias_correction1))


class AdamW(Adam):
    """Adam with decoupled weight decay: the parameter shrinks by lr * weight_decay first."""

    def __init__(self, params: Iterable, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2,
                 amsgrad: builtins.bool = False, maximize: builtins.bool = False, *,
                 foreach: builtins.bool | None = None, capturable: builtins.bool = False,
                 differentiable: builtins.bool = False, fused: builtins.bool | None = None) -> None:
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, maximize, foreach=foreach,
                         capturable=capturable, differentiable=differentiable, fused=fused,
                         decoupled_weight_decay=True)

    def load_state_dict(self, state_dict: dict) -> None:
        super().load_state_dict(state_dict)
        for group in self.param_groups:  # also from Adam's, as PyTorch's AdamW
            group["decoupled_weight_decay"] = True


class RMSprop(Optimizer):
    """RMSprop: the gradient divided by the root of a running mean of its square (`alpha` the
    mean's decay), less the squared running mean of the gradient if `centered`, with momentum."""

    def __init__(self, params: Iterable, lr: float = 1e-2, alpha: float = 0.99, eps: float = 1e-8,
                 weight_decay: float = 0.0, momentum: float = 0.0, centered: builtins.bool = False,
                 capturable: builtins.bool = False, foreach: builtins.bool | None = None,
                 maximize: builtins.bool = False, differentiable: builtins.bool = False) -> None:
        _require_not_negative(lr=lr, alpha=alpha, eps=eps, weight_decay=weight_decay,
                              momentum=momentum)
        super().__init__(params, dict(lr=lr, alpha=alpha, eps=eps, weight_decay=weight_decay,
                                      momentum=momentum, centered=centered, maximize=maximize,
                                      **_implementation(capturable=capturable, foreach=foreach,
                                                        differentiable=differentiable)))

    def _initial_state(self, parameter: Tensor, group: dict) -> dict[str, Tensor]:
        state = {"step": _step_count(), "square_avg": zeros_like(parameter)}
        if group["momentum"] > 0:
            state["momentum_buffer"] = zeros_like(parameter)
        if group["centered"]:
            state["grad_avg"] = zeros_like(parameter)
        return state

    def _update(self, parameter: Tensor, grad: Tensor, state: dict, group: dict) -> None:
        alpha, momentum = group["alpha"], group["momentum"]
        grad = _gradient(parameter, grad, group)
        state["step"].add_(1)
        square_avg = state["square_avg"].mul_(alpha).addcmul_(grad, grad, value=1 - alpha)
        if group["centered"]:
            grad_avg = state["grad_avg"].lerp_(grad, 1 - alpha)
            average = square_avg.addcmul(grad_avg, grad_avg, value=-1).sqrt()
        else:
            average = square_avg.sqrt()
        average = average + group["eps"]
        if momentum > 0:
            buffer = state["momentum_buffer"].mul_(momentum).addcdiv_(grad, average)
            parameter.add_(buffer, alpha=-group["lr"])
        else:
            parameter.addcdiv_(grad, average, value=-group["lr"])


class Adagrad(Optimizer):
    """Adagrad: the gradient divided by the root of the sum of its squares so far (which starts
    at `initial_accumulator_value`), the learning rate decayed as lr / (1 + (step - 1) * lr_decay)."""

    def __init__(self, params: Iterable, lr: float = 1e-2, lr_decay: float = 0.0,
                 weight_decay: float = 0.0, initial_accumulator_value: float = 0.0,
                 eps: float = 1e-10, foreach: builtins.bool | None = None, *,
                 maximize: builtins.bool = False, differentiable: builtins.bool = False,
                 fused: builtins.bool | None = None) -> None:
        _require_not_negative(lr=lr, lr_decay=lr_decay, weight_decay=weight_decay,
                              initial_accumulator_value=initial_accumulator_value, eps=eps)
        super().__init__(params, dict(lr=lr, lr_decay=lr_decay, eps=eps, weight_decay=weight_decay,
                                      initial_accumulator_value=initial_accumulator_value,
                                      maximize=maximize,
                                      **_implementation(foreach=foreach,
                                                        differentiable=differentiable,
                                                        fused=fused)))

    def _initial_state(self, parameter: Tensor, group: dict) -> dict[str, Tensor]:
        return {"step": _step_count(),
                "sum": full_like(parameter, group["initial_accumulator_value"])}

    def _update(self, parameter: Tensor, grad: Tensor, state: dict, group: dict) -> None:
        step = state["step"].add_(1)
        grad = _gradient(parameter, grad, group)
        decayed_lr = group["lr"] / (1 + (step - 1) * group["lr_decay"])
        standard_deviation = state["sum"].addcmul_(grad, grad, value=1).sqrt() + group["eps"]
        parameter.addcdiv_(grad, standard_deviation, value=-decayed_lr)
