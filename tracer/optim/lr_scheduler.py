"""`tr.optim.lr_scheduler`: PyTorch's schedulers with its names, arguments and arithmetic (the
same recursive formulas, so the learning rates agree to the last bit): StepLR, CosineAnnealingLR
and OneCycleLR here, the base class in lr_base.py, the others in lr_schedules.py (one formula
each) and lr_composite.py (schedulers of schedulers, ReduceLROnPlateau, CyclicLR).
"""
from __future__ import annotations

import math
from typing import Sequence

from tracer.errors import ArgumentError
from tracer.optim.lr_base import LRScheduler, Optimizer, _check_optimizer, _per_group
from tracer.optim.lr_composite import ChainedScheduler, CyclicLR, ReduceLROnPlateau, SequentialLR
from tracer.optim.lr_schedules import (ConstantLR, CosineAnnealingWarmRestarts, ExponentialLR,
                                       LambdaLR, LinearLR, MultiplicativeLR, MultiStepLR,
                                       PolynomialLR)

__all__ = ["LRScheduler", "LambdaLR", "MultiplicativeLR", "StepLR", "MultiStepLR", "ConstantLR",
           "LinearLR", "ExponentialLR", "SequentialLR", "PolynomialLR", "CosineAnnealingLR",
           "ChainedScheduler", "ReduceLROnPlateau", "CyclicLR", "CosineAnnealingWarmRestarts",
           "OneCycleLR"]


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
