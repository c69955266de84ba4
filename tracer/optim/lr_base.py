"""The base of `tr.optim.lr_scheduler`'s schedulers, LRScheduler, as PyTorch's: `step()`,
`get_last_lr()`, `last_epoch`, state_dict/load_state_dict, and the helpers the schedulers share.
A scheduler writes Python floats into the optimizer's `param_groups`, which a traced step reads on
every call (runtime/floats.py): a new learning rate needs no new compile.
"""
from __future__ import annotations

from typing import Any

from tracer.context import AbsentNamesNoted
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


class LRScheduler(AbsentNamesNoted):
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
