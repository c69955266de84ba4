"""`tr.optim.lr_scheduler`: PyTorch's schedulers with its names, arguments and arithmetic (the
same recursive formulas, so the learning rates agree to the last bit): the base class, LambdaLR,
StepLR, CosineAnnealingLR and OneCycleLR here, the others in lr_schedules.py (one formula each)
and lr_composite.py (schedulers of schedulers, ReduceLROnPlateau, CyclicLR). A scheduler writes
Python floats into the optimizer's `param_groups`, which a traced step reads on every call
(runtime/floats.py): a new learning rate needs no new compile.
"""
from __future__ import annotations

import math
import types
from typing import Any, Callable, Sequence

from tracer.errors import ArgumentError
from tracer.tensor import Tensor

# A tr.optim optimizer (tracer.optim imports this module, not the other way round): anything with
# `param_groups` and `defaults`.
Optimizer = Any


def _check_optimizer(optimizer) -> None:
    if not isinstance(getattr(optimizer, "param_groups", None), list):
        raise ArgumentError(f"{type(optimizer).__name__} is not an Optimizer")


def _per_group(name: str, optimizer: Optimizer, value) -> list:
    """One value per parameter group: `value` itself for each, or a list of one per group."""
    if isinstance(value, (list, tuple)):
        if len(value) != len(optimizer.param_groups):
            raise ArgumentError(f"{name} has {len(value)} values, the optimizer has "
                                f"{len(optimizer.param_groups)} parameter groups")
        return list(value)
    return [value] * len(optimizer.param_groups)


def _group_values(optimizer: Optimizer, key: str) -> list:
    """group[key] of every parameter group (copies of tensors, which the groups keep)."""
    return [group[key].clone() if isinstance(group[key], Tensor) else group[key]
            for group in optimizer.param_groups]


def _set_group_value(group: dict, key: str, value) -> None:
    """group[key] = value, or filled in place where group[key] is a 0-d tensor."""
    if isinstance(group[key], Tensor):
        group[key].fill_(float(value))
    else:
        group[key] = value


class LRScheduler:
    """The base of the schedulers: `step()` advances `last_epoch` by one and writes `get_lr()`
    into every parameter group's "lr" (in place if it is a 0-d tensor)."""

    def __init__(self, optimizer: Optimizer, last_epoch: int = -1) -> None:
        _check_optimizer(optimizer)
        self.optimizer = optimizer
        if last_epoch == -1:
            for group in optimizer.param_groups:
                lr = group["lr"]
                group.setdefault("initial_lr", lr.clone() if isinstance(lr, Tensor) else lr)
        else:
            for number, group in enumerate(optimizer.param_groups):
                if "initial_lr" not in group:
                    raise ArgumentError(
                        f"param_groups[{number}] has no 'initial_lr' to resume a schedule from "
                        f"(last_epoch={last_epoch}): load the optimizer's state_dict first, or "
                        f"start with last_epoch=-1")
        self.base_lrs: list = _group_values(optimizer, "initial_lr")
        self.last_epoch = last_epoch
        self._initial_step()

    def _initial_step(self) -> None:
        """The step a scheduler takes when it is made (SequentialLR takes it again when it hands
        over to the next scheduler), with `_is_initial` set for the get_lr that need to know."""
        self._step_count = 0
        self._is_initial = True
        try:
            self.step()
        finally:
            self._is_initial = False

    def get_lr(self) -> list:
        raise NotImplementedError

    def get_last_lr(self) -> list:
        """The learning rates the last `step()` set, one per parameter group."""
        return self._last_lr

    def step(self, epoch: int | None = None) -> None:
        """Advance one step (`epoch`, deprecated in PyTorch: jump to it, by the closed form where
        there is one)."""
        self._step_count += 1
        self._update_lr(epoch)

    def _update_lr(self, epoch: int | None = None) -> None:
        """Advance `last_epoch` (or set it to `epoch`) and write the new learning rates."""
        if epoch is None:
            self.last_epoch += 1
            values = self.get_lr()
        else:
            self.last_epoch = epoch
            closed_form = getattr(self, "_get_closed_form_lr", None)
            values = closed_form() if closed_form is not None else self.get_lr()
        for group, lr in zip(self.optimizer.param_groups, values):
            _set_group_value(group, "lr", lr)
        self._last_lr = _group_values(self.optimizer, "lr")

    def state_dict(self) -> dict[str, Any]:
        """Everything but the optimizer, as PyTorch's."""
        return {key: value for key, value in self.__dict__.items() if key != "optimizer"}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.__dict__.update(state_dict)

    def _current_lrs(self) -> list:
        return [group["lr"] for group in self.optimizer.param_groups]


class LambdaLR(LRScheduler):
    """lr = base_lr * lr_lambda(last_epoch), one function or one per parameter group."""

    def __init__(self, optimizer: Optimizer, lr_lambda: Callable[[int], float] | Sequence,
                 last_epoch: int = -1) -> None:
        self.optimizer = optimizer
        self.lr_lambdas: list[Callable[[int], float]] = _per_group("lr_lambda", optimizer,
                                                                     lr_lambda)
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list:
        return [base_lr * function(self.last_epoch)
                for function, base_lr in zip(self.lr_lambdas, self.base_lrs)]

    def state_dict(self) -> dict[str, Any]:
        """As PyTorch's: the state of callable objects among the lr_lambdas, not functions."""
        state = {key: value for key, value in self.__dict__.items()
                 if key not in ("optimizer", "lr_lambdas")}
        state["lr_lambdas"] = [None if isinstance(function, types.FunctionType)
                               else function.__dict__.copy() for function in self.lr_lambdas]
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        state = {key: value for key, value in state_dict.items() if key != "lr_lambdas"}
        self.__dict__.update(state)
        for function, saved in zip(self.lr_lambdas, state_dict["lr_lambdas"]):
            if saved is not None:
                function.__dict__.update(saved)


class StepLR(LRScheduler):
    """The learning rate times `gamma` every `step_size` steps."""

    def __init__(self, optimizer: Optimizer, step_size: int, gamma: float = 0.1,
                 last_epoch: int = -1) -> None:
        self.step_size, self.gamma = step_size, gamma
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list:
        if self.last_epoch == 0 or self.last_epoch % self.step_size != 0:
            return self._current_lrs()
        return [lr * self.gamma for lr in self._current_lrs()]

    def _get_closed_form_lr(self) -> list:
        return [base_lr * self.gamma ** (self.last_epoch // self.step_size)
                for base_lr in self.base_lrs]


class CosineAnnealingLR(LRScheduler):
    """Half a cosine from base_lr down to `eta_min` over `T_max` steps (then back up), by
    PyTorch's recursive formula."""

    def __init__(self, optimizer: Optimizer, T_max: int, eta_min: float = 0.0,
                 last_epoch: int = -1) -> None:
        self.T_max, self.eta_min = T_max, eta_min
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list:
        T_max, eta_min, epoch = self.T_max, self.eta_min, self.last_epoch
        if self._is_initial:
            return self._current_lrs()
        if self._step_count == 1 and epoch > 0:
            return [eta_min + (base_lr - eta_min) * (1 + math.cos(epoch * math.pi / T_max)) / 2
                    for base_lr in self.base_lrs]
        if (epoch - 1 - T_max) % (2 * T_max) == 0:
            return [lr + (base_lr - eta_min) * (1 - math.cos(math.pi / T_max)) / 2
                    for base_lr, lr in zip(self.base_lrs, self._current_lrs())]
        return [(1 + math.cos(math.pi * epoch / T_max))
                / (1 + math.cos(math.pi * (epoch - 1) / T_max)) * (lr - eta_min) + eta_min
                for lr in self._current_lrs()]

    def _get_closed_form_lr(self) -> list:
        return [self.eta_min + (base_lr - self.eta_min)
                * (1 + math.cos(math.pi * self.last_epoch / self.T_max)) / 2
                for base_lr in self.base_lrs]


class OneCycleLR(LRScheduler):
    """The 1cycle policy: the learning rate rises from max_lr / div_factor to max_lr over
    `pct_start` of the steps, then anneals to initial_lr / final_div_factor; the momentum (or
    Adam's beta1) cycles the other way between max_momentum and base_momentum."""

    def __init__(self, optimizer: Optimizer, max_lr: float | Sequence[float],
                 total_steps: int | None = None, epochs: int | None = None,
                 steps_per_epoch: int | None = None, pct_start: float = 0.3,
                 anneal_strategy: str = "cos", cycle_momentum: bool = True,
                 base_momentum: float | Sequence[float] = 0.85,
                 max_momentum: float | Sequence[float] = 0.95, div_factor: float = 25.0,
                 final_div_factor: float = 1e4, three_phase: bool = False,
                 last_epoch: int = -1) -> None:
        _check_optimizer(optimizer)
        self.optimizer = optimizer
        if total_steps is not None:
            if not isinstance(total_steps, int) or total_steps <= 0:
                raise ArgumentError(f"Expected positive integer total_steps, but got "
                                    f"{total_steps}")
            self.total_steps = total_steps
        elif epochs is not None and steps_per_epoch is not None:
            for name, value in (("epochs", epochs), ("steps_per_epoch", steps_per_epoch)):
                if not isinstance(value, int) or value <= 0:
                    raise ArgumentError(f"Expected positive integer {name}, but got {value}")
            self.total_steps = epochs * steps_per_epoch
        else:
            raise ArgumentError("You must define either total_steps OR (epochs AND "
                                "steps_per_epoch)")
        if not isinstance(pct_start, float) or not 0 <= pct_start <= 1:
            raise ArgumentError(f"Expected float between 0 and 1 pct_start, but got {pct_start}")
        if anneal_strategy not in ("cos", "linear"):
            raise ArgumentError(f"anneal_strategy must be one of 'cos' or 'linear', instead got "
                                f"{anneal_strategy}")
        self._anneal_func_type = anneal_strategy
        rise = float(pct_start * self.total_steps) - 1
        # (end step, start lr, end lr, start momentum, end momentum), as PyTorch's phases
        self._schedule_phases = [
            (rise, "initial_lr", "max_lr", "max_momentum", "base_momentum"),
            (float(2 * pct_start * self.total_steps) - 2, "max_lr", "initial_lr",
             "base_momentum", "max_momentum"),
            (self.total_steps - 1, "initial_lr", "min_lr", "max_momentum", "max_momentum"),
        ] if three_phase else [
            (rise, "initial_lr", "max_lr", "max_momentum", "base_momentum"),
            (self.total_steps - 1, "max_lr", "min_lr", "base_momentum", "max_momentum"),
        ]
        if last_epoch == -1:
            for group, top in zip(optimizer.param_groups, _per_group("max_lr", optimizer, max_lr)):
                group["initial_lr"] = top / div_factor
                group["max_lr"] = top
                group["min_lr"] = group["initial_lr"] / final_div_factor
        self.cycle_momentum = cycle_momentum
        if cycle_momentum:
            if "momentum" not in optimizer.defaults and "betas" not in optimizer.defaults:
                raise ArgumentError("optimizer must support momentum or beta1 with "
                                    "`cycle_momentum` option enabled")
            self.use_beta1 = "betas" in optimizer.defaults
            if last_epoch == -1:
                for group, top, bottom in zip(
                        optimizer.param_groups,
                        _per_group("max_momentum", optimizer, max_momentum),
                        _per_group("base_momentum", optimizer, base_momentum)):
                    self._set_momentum(group, top)
                    group["max_momentum"], group["base_momentum"] = top, bottom
        super().__init__(optimizer, last_epoch)

    def _set_momentum(self, group: dict, momentum: float) -> None:
        if self.use_beta1:
            group["betas"] = (momentum, *group["betas"][1:])
        else:
            group["momentum"] = momentum

    def _anneal(self, start: float, end: float, fraction: float) -> float:
        if self._anneal_func_type == "cos":
            return end + (start - end) / 2.0 * (math.cos(math.pi * fraction) + 1)
        return (end - start) * fraction + start

    def get_lr(self) -> list:
        step = self.last_epoch
        if step > self.total_steps:
            raise ArgumentError(f"Tried to step {step} times. The specified number of total "
                                f"steps is {self.total_steps}")
        lrs = []
        for group in self.optimizer.param_groups:
            start_step = 0.0
            for number, (end_step, start_lr, end_lr, start_momentum, end_momentum) in enumerate(
                    self._schedule_phases):
                if step <= end_step or number == len(self._schedule_phases) - 1:
                    fraction = (step - start_step) / (end_step - start_step)
                    lrs.append(self._anneal(group[start_lr], group[end_lr], fraction))
                    if self.cycle_momentum:
                        self._set_momentum(group, self._anneal(
                            group[start_momentum], group[end_momentum], fraction))
                    break
                start_step = end_step
        return lrs


# (imported last: those modules build on the base class above)
from tracer.optim.lr_schedules import (ConstantLR, CosineAnnealingWarmRestarts,  # noqa: E402
                                       ExponentialLR, LinearLR, MultiplicativeLR, MultiStepLR,
                                       PolynomialLR)
from tracer.optim.lr_composite import (ChainedScheduler, CyclicLR, ReduceLROnPlateau,  # noqa: E402
                                       SequentialLR)

__all__ = ["LRScheduler", "LambdaLR", "MultiplicativeLR", "StepLR", "MultiStepLR", "ConstantLR",
           "LinearLR", "ExponentialLR", "SequentialLR", "PolynomialLR", "CosineAnnealingLR",
           "ChainedScheduler", "ReduceLROnPlateau", "CyclicLR", "CosineAnnealingWarmRestarts",
           "OneCycleLR"]
