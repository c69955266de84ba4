"""The schedulers of `tr.optim.lr_scheduler` that follow one formula each: LambdaLR,
MultiplicativeLR, MultiStepLR, ConstantLR, LinearLR, ExponentialLR, PolynomialLR and
CosineAnnealingWarmRestarts, with PyTorch's arguments, checks and recursive formulas (each step multiplies the current learning
rate, as PyTorch's does, so the rates agree to the last bit; `step(epoch)` uses the closed form).
"""
from __future__ import annotations

import math
import types
from bisect import bisect_right
from collections import Counter
from typing import Any, Callable, Iterable, Sequence

from tracer.errors import ArgumentError
from tracer.optim.lr_base import (LRScheduler, Optimizer, _group_values, _per_group,
                                  _set_group_value)


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


class MultiplicativeLR(LRScheduler):
    """Each step multiplies the learning rate by lr_lambda(last_epoch), one function or one per
    parameter group."""

    def __init__(self, optimizer: Optimizer, lr_lambda: Callable[[int], float] | Sequence,
                 last_epoch: int = -1) -> None:
        self.optimizer = optimizer
        self.lr_lambdas: list[Callable[[int], float]] = _per_group("lr_lambda", optimizer,
                                                                     lr_lambda)
        for function in self.lr_lambdas:
            if not callable(function):
                raise ArgumentError(f"lr_lambda should be a function, but got "
                                    f"{type(function).__name__}")
        super().__init__(optimizer, last_epoch)

    # the state of callable objects among the lr_lambdas, as LambdaLR's (and PyTorch's)
    state_dict = LambdaLR.state_dict
    load_state_dict = LambdaLR.load_state_dict

    def get_lr(self) -> list:
        if self._is_initial:
            return self._current_lrs()
        return [group["lr"] * function(self.last_epoch)
                for function, group in zip(self.lr_lambdas, self.optimizer.param_groups)]


class MultiStepLR(LRScheduler):
    """The learning rate times `gamma` at each milestone (twice at a milestone given twice)."""

    def __init__(self, optimizer: Optimizer, milestones: Iterable[int], gamma: float = 0.1,
                 last_epoch: int = -1) -> None:
        self.milestones = Counter(milestones)
        self.gamma = gamma
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list:
        if self.last_epoch not in self.milestones:
            return self._current_lrs()
        return [lr * self.gamma ** self.milestones[self.last_epoch] for lr in self._current_lrs()]

    def _get_closed_form_lr(self) -> list:
        milestones = sorted(self.milestones.elements())
        return [base_lr * self.gamma ** bisect_right(milestones, self.last_epoch)
                for base_lr in self.base_lrs]


class ConstantLR(LRScheduler):
    """The learning rate times `factor` for the first `total_iters` steps."""

    def __init__(self, optimizer: Optimizer, factor: float = 1.0 / 3, total_iters: int = 5,
                 last_epoch: int = -1) -> None:
        if factor > 1.0 or factor < 0:
            raise ArgumentError(f"Constant multiplicative factor expected to be between 0 and 1, "
                                f"got {factor}")
        self.factor, self.total_iters = factor, total_iters
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list:
        if self.last_epoch == 0:
            return [lr * self.factor for lr in self._current_lrs()]
        if self.last_epoch != self.total_iters:
            return self._current_lrs()
        return [lr * (1.0 / self.factor) for lr in self._current_lrs()]

    def _get_closed_form_lr(self) -> list:
        return [base_lr * (self.factor + (self.last_epoch >= self.total_iters) * (1 - self.factor))
                for base_lr in self.base_lrs]


class LinearLR(LRScheduler):
    """The factor of the learning rate goes linearly from `start_factor` to `end_factor` over
    `total_iters` steps."""

    def __init__(self, optimizer: Optimizer, start_factor: float = 1.0 / 3,
                 end_factor: float = 1.0, total_iters: int = 5, last_epoch: int = -1) -> None:
        if start_factor > 1.0 or start_factor <= 0:
            raise ArgumentError(f"Starting multiplicative factor expected to be greater than 0 "
                                f"and less or equal to 1, got {start_factor}")
        if end_factor > 1.0 or end_factor < 0:
            raise ArgumentError(f"Ending multiplicative factor expected to be between 0 and 1, "
                                f"got {end_factor}")
        self.start_factor, self.end_factor, self.total_iters = start_factor, end_factor, total_iters
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list:
        if self.last_epoch == 0:
            return [lr * self.start_factor for lr in self._current_lrs()]
        if self._is_initial or self.last_epoch > self.total_iters:
            return self._current_lrs()
        change = self.end_factor - self.start_factor
        ratio = 1.0 + change / (self.total_iters * self.start_factor
                                + (self.last_epoch - 1) * change)
        return [lr * ratio for lr in self._current_lrs()]

    def _get_closed_form_lr(self) -> list:
        return [base_lr * (self.start_factor + (self.end_factor - self.start_factor)
                           * min(self.total_iters, self.last_epoch) / self.total_iters)
                for base_lr in self.base_lrs]


class ExponentialLR(LRScheduler):
    """The learning rate times `gamma` every step."""

    def __init__(self, optimizer: Optimizer, gamma: float, last_epoch: int = -1) -> None:
        self.gamma = gamma
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list:
        if self._is_initial:
            return self._current_lrs()
        return [lr * self.gamma for lr in self._current_lrs()]

    def _get_closed_form_lr(self) -> list:
        return [base_lr * self.gamma ** self.last_epoch for base_lr in self.base_lrs]


class PolynomialLR(LRScheduler):
    """base_lr * (1 - step / total_iters) ** power, then 0 (as PyTorch, step by step: each step
    multiplies by the ratio of two such factors)."""

    def __init__(self, optimizer: Optimizer, total_iters: int = 5, power: float = 1.0,
                 last_epoch: int = -1) -> None:
        self.total_iters, self.power = total_iters, power
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list:
        if self._is_initial or self.last_epoch > self.total_iters:
            return self._current_lrs()
        decay_factor = ((1.0 - self.last_epoch / self.total_iters)
                        / (1.0 - (self.last_epoch - 1) / self.total_iters)) ** self.power
        return [lr * decay_factor for lr in self._current_lrs()]

    def _get_closed_form_lr(self) -> list:
        return [base_lr * (1.0 - min(self.total_iters, self.last_epoch) / self.total_iters)
                ** self.power for base_lr in self.base_lrs]


class CosineAnnealingWarmRestarts(LRScheduler):
    """Cosine annealing from base_lr to `eta_min` over T_0 steps, restarting at base_lr, each
    period `T_mult` times the last (SGDR). `step(epoch)` takes a fractional epoch too."""

    def __init__(self, optimizer: Optimizer, T_0: int, T_mult: int = 1, eta_min: float = 0.0,
                 last_epoch: int = -1) -> None:
        if not isinstance(T_0, int) or T_0 <= 0:
            raise ArgumentError(f"Expected positive integer T_0, but got {T_0}")
        if not isinstance(T_mult, int) or T_mult < 1:
            raise ArgumentError(f"Expected integer T_mult >= 1, but got {T_mult}")
        if not isinstance(eta_min, (float, int)):
            raise ArgumentError(f"Expected float or int eta_min, but got {eta_min} of type "
                                f"{type(eta_min).__name__}")
        self.T_0, self.T_i, self.T_mult, self.eta_min = T_0, T_0, T_mult, eta_min
        self.T_cur = last_epoch
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list:
        return [self.eta_min + (base_lr - self.eta_min)
                * (1 + math.cos(math.pi * self.T_cur / self.T_i)) / 2 for base_lr in self.base_lrs]

    def step(self, epoch: float | None = None) -> None:
        """The next step, or (as PyTorch's, not deprecated here) the point `epoch` of the
        schedule, which may be a fraction: step(epoch + batch / batches) within an epoch."""
        # (PyTorch's own step does not count _step_count either)
        if epoch is None and self.last_epoch < 0:
            epoch = 0
        if epoch is None:
            epoch = self.last_epoch + 1
            self.T_cur = self.T_cur + 1
            if self.T_cur >= self.T_i:
                self.T_cur = self.T_cur % self.T_i
                self.T_i = self.T_i * self.T_mult
        elif epoch < 0:
            raise ArgumentError(f"Expected non-negative epoch, but got {epoch}")
        elif epoch >= self.T_0:
            if self.T_mult == 1:
                self.T_cur = epoch % self.T_0
            else:
                restarts = int(math.log(epoch / self.T_0 * (self.T_mult - 1) + 1, self.T_mult))
                self.T_cur = epoch - self.T_0 * (self.T_mult ** restarts - 1) / (self.T_mult - 1)
                self.T_i = self.T_0 * self.T_mult ** restarts
        else:
            self.T_i, self.T_cur = self.T_0, epoch
        self.last_epoch = math.floor(epoch)
        for group, lr in zip(self.optimizer.param_groups, self.get_lr()):
            _set_group_value(group, "lr", lr)
        self._last_lr = _group_values(self.optimizer, "lr")
