"""`tr.optim`: SGD, Adam and AdamW with PyTorch's update rules, in PyTorch's order of operations
(and `tr.optim.lr_scheduler`).

The state (momentum buffers, moment estimates, the step count) is made of tensors when the
optimizer is made and updated in place under no_grad, so that `opt.step()` inside a traced step
is recorded like any in-place update: the parameters and the state, runtime inputs of the traced
function (arguments, or tensors read from the optimizer object), are updated in the compiled call.
Reading a parameter's `.grad` goes through `current_tensor`, which finds an argument's stand-in in
the trace (where the traced backward put the gradient).
"""
from __future__ import annotations

import builtins
from typing import Callable, Iterable

from tracer.context import enable_grad, no_grad
from tracer.errors import ArgumentError
from tracer.ir.types import float64, is_float
from tracer.arithmetic import where
from tracer.backward import clear_grads
from tracer.creation import zeros, zeros_like
from tracer.interop import loaded_tensor
from tracer.tensor import Tensor
from tracer.tracing import current_tensor
from tracer.optim import lr_scheduler  # tr.optim.lr_scheduler, as torch.optim's

__all__ = ["Optimizer", "SGD", "Adam", "AdamW", "lr_scheduler"]


class Optimizer:
    """Parameter groups (dicts with "params" and the hyperparameters) and per-parameter state."""

    def __init__(self, params: Iterable, defaults: dict) -> None:
        self.defaults = defaults
        self.state: dict[Tensor, dict[str, Tensor]] = {}
        self.param_groups: list[dict] = []
        groups = list(params)
        if not groups:
            raise ArgumentError(f"{type(self).__name__} got an empty parameter list")
        for group in groups if isinstance(groups[0], dict) else [{"params": groups}]:
            self.add_param_group(group)

    def add_param_group(self, group: dict) -> None:
        group = dict(group)
        params = group["params"]
        params = [params] if isinstance(params, Tensor) else list(params)
        known = {id(p) for g in self.param_groups for p in g["params"]}
        for p in params:
            if not isinstance(p, Tensor) or not is_float(p.dtype) or not p.is_leaf:
                raise ArgumentError(f"{type(self).__name__} optimizes float leaf tensors, got "
                                    f"{type(p).__name__ if not isinstance(p, Tensor) else p}")
            if id(p) in known:
                raise ArgumentError("a parameter appears in more than one parameter group")
        group["params"] = params
        for name, value in self.defaults.items():
            group.setdefault(name, value)
        self.param_groups.append(group)
        for p in params:
            self.state[p] = self._initial_state(p, group)

    def _initial_state(self, parameter: Tensor, group: dict) -> dict[str, Tensor]:
        return {}

    def state_dict(self) -> dict:
        """PyTorch's layout: "state" by parameter index, "param_groups" with the indices."""
        index = {id(p): i for i, p in enumerate(p for g in self.param_groups for p in g["params"])}
        return {
            "state": {index[id(p)]: {name: t.detach().clone() for name, t in entry.items()}
                      for p, entry in self.state.items() if entry},
            "param_groups": [dict(group, params=[index[id(p)] for p in group["params"]])
                             for group in self.param_groups]}

    def load_state_dict(self, state_dict: dict) -> None:
        """Take the hyperparameters and state of `state_dict` (from state_dict() of an optimizer
        over parameters of the same shapes), copying the state into this one's tensors in place."""
        groups = state_dict["param_groups"]
        if [len(g["params"]) for g in groups] != [len(g["params"]) for g in self.param_groups]:
            raise ArgumentError("load_state_dict: the parameter groups differ in size from this "
                                "optimizer's")
        parameters = [(p, g) for g in self.param_groups for p in g["params"]]
        for group, saved in zip(self.param_groups, groups):
            group.update({k: v for k, v in saved.items() if k != "params"})
        with no_grad():
            for index, entry in state_dict["state"].items():
                parameter, group = parameters[index]
                # the loaded hyperparameters decide the state (amsgrad adds a tensor), as in
                # PyTorch; tensors already there are kept, to be updated in place
                own = dict(self._initial_state(parameter, group), **self.state[parameter])
                if set(entry) != set(own):
                    raise ArgumentError(f"load_state_dict: state {sorted(entry)} for parameter "
                                        f"{index}, this optimizer keeps {sorted(own)}")
                self.state[parameter] = own
                for name, value in entry.items():
                    value = loaded_tensor(value, f"load_state_dict: {name} of parameter {index}")
                    if value.shape != own[name].shape:
                        raise ArgumentError(f"load_state_dict: {name} of parameter {index} has "
                                            f"shape {list(value.shape)}, expected "
                                            f"{list(own[name].shape)}")
                    own[name].copy_(value)

    def zero_grad(self, set_to_none: builtins.bool = True) -> None:
        clear_grads((p for group in self.param_groups for p in group["params"]), set_to_none)

    def step(self, closure: Callable | None = None):
        """One update of every parameter that has a gradient; `closure` recomputes the loss."""
        loss = None
        if closure is not None:
            with enable_grad():
                loss = closure()
        with no_grad():
            for group in self.param_groups:
                for parameter in group["params"]:
                    current = current_tensor(parameter)
                    if current.grad is not None:
                        self._update(current, current.grad, self.state[parameter], group)
        return loss

    def _update(self, parameter: Tensor, grad: Tensor, state: dict, group: dict) -> None:
        raise NotImplementedError


def _step_count() -> Tensor:
    # float64, so that the bias corrections beta ** step are computed as PyTorch computes them
    # (in Python floats) for float32 parameters too.
    return zeros((), dtype=float64)


class SGD(Optimizer):
    """Stochastic gradient descent with momentum, dampening, Nesterov momentum and weight decay."""

    def __init__(self, params: Iterable, lr: float = 1e-3, momentum: float = 0.0,
                 dampening: float = 0.0, weight_decay: float = 0.0,
                 nesterov: builtins.bool = False, maximize: builtins.bool = False) -> None:
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ArgumentError("Nesterov momentum needs a momentum and zero dampening")
        super().__init__(params, dict(lr=lr, momentum=momentum, dampening=dampening,
                                      weight_decay=weight_decay, nesterov=nesterov,
                                      maximize=maximize))

    def _initial_state(self, parameter: Tensor, group: dict) -> dict[str, Tensor]:
        if group["momentum"] == 0:
            return {}
        state = {"momentum_buffer": zeros_like(parameter)}
        if group["dampening"] != 0:  # the first step is told apart by the count
            state["step"] = _step_count()
        return state

    def _update(self, parameter: Tensor, grad: Tensor, state: dict, group: dict) -> None:
        if group["maximize"]:
            grad = -grad
        if group["weight_decay"] != 0:
            grad = grad.add(parameter, alpha=group["weight_decay"])
        momentum = group["momentum"]
        if momentum != 0:
            if "momentum_buffer" not in state:  # momentum set after the optimizer was made
                state.update(self._initial_state(parameter, group))
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
    """Adam (with `weight_decay` as an L2 term in the gradient); AdamW decouples it."""

    decoupled_weight_decay = False

    def __init__(self, params: Iterable, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, amsgrad: builtins.bool = False,
                 maximize: builtins.bool = False) -> None:
        if not 0.0 <= betas[0] < 1.0 or not 0.0 <= betas[1] < 1.0:
            raise ArgumentError(f"betas must be in [0, 1), got {betas}")
        if eps < 0 or weight_decay < 0:
            raise ArgumentError("eps and weight_decay must not be negative")
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps,
                                      weight_decay=weight_decay, amsgrad=amsgrad,
                                      maximize=maximize))

    def _initial_state(self, parameter: Tensor, group: dict) -> dict[str, Tensor]:
        state = {"step": _step_count(), "exp_avg": zeros_like(parameter),
                 "exp_avg_sq": zeros_like(parameter)}
        if group["amsgrad"]:
            state["max_exp_avg_sq"] = zeros_like(parameter)
        return state

    def _update(self, parameter: Tensor, grad: Tensor, state: dict, group: dict) -> None:
        lr, (beta1, beta2), weight_decay = group["lr"], group["betas"], group["weight_decay"]
        if group["maximize"]:
            grad = -grad
        step = state["step"].add_(1)
        if weight_decay != 0:
            if self.decoupled_weight_decay:
                parameter.mul_(1 - lr * weight_decay)
            else:
                grad = grad.add(parameter, alpha=weight_decay)
        exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
        exp_avg.lerp_(grad, 1 - beta1)
        exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
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

    decoupled_weight_decay = True

    def __init__(self, params: Iterable, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2, amsgrad: builtins.bool = False,
                 maximize: builtins.bool = False) -> None:
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, maximize)
