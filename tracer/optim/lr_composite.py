"""The schedulers of `tr.optim.lr_scheduler` that are not one formula of the step: SequentialLR
and ChainedScheduler (schedulers of schedulers), ReduceLROnPlateau (driven by a metric) and
CyclicLR, as PyTorch's.
"""
from __future__ import annotations

import math
import types
from bisect import bisect_right
from functools import partial
from typing import Any, Callable, Sequence

from tracer.errors import ArgumentError, TracingError
from tracer.optim.lr_base import (LRScheduler, Optimizer, _check_optimizer, _group_values,
                                  _per_group, _set_group_value)
from tracer.tensor import Tensor


def _check_schedulers(kind: str, optimizer: Optimizer, schedulers: Sequence) -> None:
    """The checks of PyTorch's SequentialLR and ChainedScheduler on their schedulers."""
    if len(schedulers) < 1:
        raise ArgumentError(f"{kind} expects at least one scheduler, but got no scheduler")
    for index, scheduler in enumerate(schedulers):
        if not hasattr(scheduler, "optimizer"):
            raise ArgumentError(f"{kind} at index {index} should have `optimizer` as its attribute")
        if isinstance(scheduler, ReduceLROnPlateau):
            raise ArgumentError(f"{kind} does not support `ReduceLROnPlateau` scheduler as it "
                                f"requires additional kwargs to be specified when calling "
                                f"`step`, but got one at index {index}")
        if scheduler.optimizer is not optimizer:
            raise ArgumentError(f"{kind} expects all schedulers to belong to the same optimizer, "
                                f"but the {type(scheduler).__name__} at index {index} has "
                                f"another")


class _OfSchedulers(LRScheduler):
    """state_dict and load_state_dict of a scheduler of `_schedulers`: theirs nested in its own,
    as PyTorch's."""

    def state_dict(self) -> dict[str, Any]:
        state = {key: value for key, value in self.__dict__.items()
                 if key not in ("optimizer", "_schedulers")}
        state["_schedulers"] = [scheduler.state_dict() for scheduler in self._schedulers]
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.__dict__.update({key: value for key, value in state_dict.items()
                              if key != "_schedulers"})
        for scheduler, saved in zip(self._schedulers, state_dict["_schedulers"]):
            scheduler.load_state_dict(saved)


class SequentialLR(_OfSchedulers):
    """`schedulers` one after the other, the next taking over at each of the `milestones` (and
    starting its schedule there)."""

    def __init__(self, optimizer: Optimizer, schedulers: list[LRScheduler], milestones: list[int],
                 last_epoch: int = -1) -> None:
        _check_schedulers("SequentialLR", optimizer, schedulers)
        if len(milestones) != len(schedulers) - 1:
            raise ArgumentError(f"SequentialLR expects one milestone fewer than schedulers, got "
                                f"{len(schedulers)} schedulers and {len(milestones)} milestones")
        self._schedulers, self._milestones = schedulers, milestones
        self.last_epoch = last_epoch + 1
        self.optimizer = optimizer
        # undo the steps the schedulers took when they were made, and start the first again
        for group in optimizer.param_groups:
            _set_group_value(group, "lr", group["initial_lr"])
        self._undo_initial_steps(self)
        index = bisect_right(self._milestones, 0)
        self._schedulers[index]._initial_step()
        self._last_lr = schedulers[index].get_last_lr()

    def _undo_initial_steps(self, scheduler) -> None:
        if hasattr(scheduler, "_schedulers"):
            for inner in scheduler._schedulers:
                self._undo_initial_steps(inner)
        elif hasattr(scheduler, "last_epoch"):
            scheduler.last_epoch -= 1

    def step(self) -> None:
        self.last_epoch += 1
        index = bisect_right(self._milestones, self.last_epoch)
        scheduler = self._schedulers[index]
        if index > 0 and self._milestones[index - 1] == self.last_epoch:
            scheduler._update_lr(0)  # the scheduler taking over starts at its epoch 0
        else:
            scheduler.step()
        self._last_lr = scheduler.get_last_lr()


class ChainedScheduler(_OfSchedulers):
    """Every step steps each of `schedulers` in turn, each multiplying (or setting) the learning
    rate the one before left."""

    def __init__(self, schedulers: Sequence[LRScheduler],
                 optimizer: Optimizer | None = None) -> None:
        if len(schedulers) < 1:
            raise ArgumentError("ChainedScheduler expects at least one scheduler to be chained, "
                                "but got no scheduler")
        optimizer = optimizer or schedulers[0].optimizer
        _check_schedulers("ChainedScheduler", optimizer, schedulers)
        self._schedulers, self.optimizer = schedulers, optimizer
        self._last_lr = _group_values(self._schedulers[-1].optimizer, "lr")

    def step(self) -> None:
        for scheduler in self._schedulers:
            scheduler.step()
        self._last_lr = _group_values(self._schedulers[-1].optimizer, "lr")


class ReduceLROnPlateau(LRScheduler):
    """The learning rate times `factor` once `step(metrics)` has seen no improvement (by more
    than `threshold`, relative or absolute) for `patience` steps, then `cooldown` steps before
    counting again; never below `min_lr`, nor by less than `eps`."""

    def __init__(self, optimizer: Optimizer, mode: str = "min", factor: float = 0.1,
                 patience: int = 10, threshold: float = 1e-4, threshold_mode: str = "rel",
                 cooldown: int = 0, min_lr: list[float] | float = 0, eps: float = 1e-8) -> None:
        if factor >= 1.0:
            raise ArgumentError(f"Factor should be < 1.0, got {factor}")
        self.factor = factor
        _check_optimizer(optimizer)
        self.optimizer = optimizer
        # (a single min_lr also serves groups added later, as PyTorch's)
        self.default_min_lr = None if isinstance(min_lr, (list, tuple)) else min_lr
        self.min_lrs = _per_group("min_lr", optimizer, min_lr)
        self.patience, self.cooldown, self.eps = patience, cooldown, eps
        self.last_epoch = 0
        self._last_lr = _group_values(optimizer, "lr")
        self._init_is_better(mode, threshold, threshold_mode)
        self._reset()

    def _reset(self) -> None:
        self.best = self.mode_worse
        self.cooldown_counter = 0
        self.num_bad_epochs = 0

    def step(self, metrics: float | Tensor, epoch: int | None = None) -> None:
        """One epoch's `metrics` (a number, or a one-element tensor whose value is read)."""
        if isinstance(metrics, Tensor) and metrics._trace is not None:
            raise TracingError(
                "ReduceLROnPlateau.step(metrics) decides in Python, from the metric's value, "
                "whether to lower the learning rate, and a tensor traced by @tr.trace has no value "
                "until the compiled function runs: return the metric from the traced function "
                "and call scheduler.step(metric) after the call")
        current = float(metrics)
        self.last_epoch = self.last_epoch + 1 if epoch is None else epoch
        if self._is_better(current, self.best):
            self.best = current
            self.num_bad_epochs = 0
        else:
            self.num_bad_epochs += 1
        if self.in_cooldown:
            self.cooldown_counter -= 1
            self.num_bad_epochs = 0  # ignore any bad epochs in cooldown
        if self.num_bad_epochs > self.patience:
            self._reduce_lr()
            self.cooldown_counter = self.cooldown
            self.num_bad_epochs = 0
        self._last_lr = _group_values(self.optimizer, "lr")

    def _reduce_lr(self) -> None:
        if len(self.optimizer.param_groups) != len(self.min_lrs):
            if self.default_min_lr is None:
                raise ArgumentError(
                    f"The number of param groups in the `optimizer` "
                    f"({len(self.optimizer.param_groups)}) differs from when `ReduceLROnPlateau` "
                    f"was initialized ({len(self.min_lrs)}): set its `min_lrs` to one per group")
            self.min_lrs = [self.default_min_lr] * len(self.optimizer.param_groups)
        for group, min_lr in zip(self.optimizer.param_groups, self.min_lrs):
            old_lr = float(group["lr"])
            new_lr = max(old_lr * self.factor, min_lr)
            if old_lr - new_lr > self.eps:
                _set_group_value(group, "lr", new_lr)

    @property
    def in_cooldown(self) -> bool:
        return self.cooldown_counter > 0

    def _is_better(self, value: float, best: float) -> bool:
        if self.mode == "min" and self.threshold_mode == "rel":
            return value < best * (1.0 - self.threshold)
        if self.mode == "min":
            return value < best - self.threshold
        if self.threshold_mode == "rel":
            return value > best * (self.threshold + 1.0)
        return value > best + self.threshold

    def _init_is_better(self, mode: str, threshold: float, threshold_mode: str) -> None:
        if mode not in ("min", "max"):
            raise ArgumentError(f"mode {mode} is unknown!")
        if threshold_mode not in ("rel", "abs"):
            raise ArgumentError(f"threshold mode {threshold_mode} is unknown!")
        self.mode_worse = math.inf if mode == "min" else -math.inf
        self.mode, self.threshold, self.threshold_mode = mode, threshold, threshold_mode

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.__dict__.update(state_dict)
        self._init_is_better(self.mode, self.threshold, self.threshold_mode)


class CyclicLR(LRScheduler):
    """The learning rate cycles between `base_lr` and `max_lr` (up over `step_size_up` steps,
    down over `step_size_down`), the amplitude scaled per cycle ("triangular", "triangular2") or
    per step ("exp_range", gamma ** step), or by `scale_fn`; the momentum (Adam's beta1) cycles
    the other way between `max_momentum` and `base_momentum`."""

    def __init__(self, optimizer: Optimizer, base_lr: float | list[float],
                 max_lr: float | list[float], step_size_up: int = 2000,
                 step_size_down: int | None = None, mode: str = "triangular", gamma: float = 1.0,
                 scale_fn: Callable[[float], float] | None = None, scale_mode: str = "cycle",
                 cycle_momentum: bool = True, base_momentum: float = 0.8,
                 max_momentum: float = 0.9, last_epoch: int = -1) -> None:
        _check_optimizer(optimizer)
        self.optimizer = optimizer
        base_lrs = _per_group("base_lr", optimizer, base_lr)
        if last_epoch == -1:
            for lr, group in zip(base_lrs, optimizer.param_groups):
                _set_group_value(group, "lr", lr)
        self.max_lrs = _per_group("max_lr", optimizer, max_lr)
        step_size_up = float(step_size_up)
        step_size_down = float(step_size_down) if step_size_down is not None else step_size_up
        self.total_size = step_size_up + step_size_down
        self.step_ratio = step_size_up / self.total_size
        if mode not in ("triangular", "triangular2", "exp_range") and scale_fn is None:
            raise ArgumentError(f"mode {mode!r} is invalid and scale_fn is None")
        self.mode, self.gamma = mode, gamma
        self._scale_fn_custom, self.scale_mode = scale_fn, scale_mode
        self._init_scale_fn()
        self.cycle_momentum = cycle_momentum
        if cycle_momentum:
            if "momentum" not in optimizer.defaults and "betas" not in optimizer.defaults:
                raise ArgumentError("optimizer must support momentum or beta1 with "
                                    "`cycle_momentum` option enabled")
            self.use_beta1 = "betas" in optimizer.defaults
            self.base_momentums = _per_group("base_momentum", optimizer, base_momentum)
            self.max_momentums = _per_group("max_momentum", optimizer, max_momentum)
            if last_epoch == -1:
                for top, bottom, group in zip(self.max_momentums, self.base_momentums,
                                              optimizer.param_groups):
                    self._set_momentum(group, top)
                    group["max_momentum"], group["base_momentum"] = top, bottom
        super().__init__(optimizer, last_epoch)
        self.base_lrs = base_lrs

    def _init_scale_fn(self) -> None:
        if self._scale_fn_custom is not None:
            return
        if self.mode == "triangular":
            self._scale_fn_ref, self.scale_mode = self._triangular_scale_fn, "cycle"
        elif self.mode == "triangular2":
            self._scale_fn_ref, self.scale_mode = self._triangular2_scale_fn, "cycle"
        else:
            self._scale_fn_ref = partial(self._exp_range_scale_fn, self.gamma)
            self.scale_mode = "iterations"

    def scale_fn(self, x: float) -> float:
        if self._scale_fn_custom is not None:
            return self._scale_fn_custom(x)
        return self._scale_fn_ref(x)

    @staticmethod
    def _triangular_scale_fn(x: float) -> float:
        return 1.0

    @staticmethod
    def _triangular2_scale_fn(x: float) -> float:
        return 1 / (2.0 ** (x - 1))

    @staticmethod
    def _exp_range_scale_fn(gamma: float, x: float) -> float:
        return gamma**x

    def _set_momentum(self, group: dict, momentum: float) -> None:
        if self.use_beta1:
            group["betas"] = (momentum, *group["betas"][1:])
        else:
            group["momentum"] = momentum

    def get_lr(self) -> list:
        cycle = math.floor(1 + self.last_epoch / self.total_size)
        x = 1.0 + self.last_epoch / self.total_size - cycle
        if x <= self.step_ratio:
            scale_factor = x / self.step_ratio
        else:
            scale_factor = (x - 1) / (self.step_ratio - 1)
        scale = self.scale_fn(cycle if self.scale_mode == "cycle" else self.last_epoch)
        lrs = [base_lr + (max_lr - base_lr) * scale_factor * scale
               for base_lr, max_lr in zip(self.base_lrs, self.max_lrs)]
        if self.cycle_momentum:
            for group, bottom, top in zip(self.optimizer.param_groups, self.base_momentums,
                                          self.max_momentums):
                self._set_momentum(group, top - (top - bottom) * scale_factor * scale)
        return lrs

    def state_dict(self) -> dict[str, Any]:
        """As PyTorch's: without the scale function, but with the state of a callable object."""
        state = super().state_dict()
        state.pop("_scale_fn_ref", None)
        function = state.pop("_scale_fn_custom")
        state["_scale_fn_custom"] = (function.__dict__.copy() if function is not None
                                     and not isinstance(function, types.FunctionType) else None)
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        saved = state_dict["_scale_fn_custom"]
        super().load_state_dict({key: value for key, value in state_dict.items()
                                 if key != "_scale_fn_custom"})
        if saved is not None:
            self._scale_fn_custom.__dict__.update(saved)
        self._init_scale_fn()
