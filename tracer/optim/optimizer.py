"""The base of `tr.optim`'s optimizers: parameter groups, per-parameter state made of tensors,
state_dict/load_state_dict in PyTorch's layout, zero_grad and step (the update of one parameter is
each optimizer's `_update`), and the helpers the optimizers share.

The state (momentum buffers, moment estimates, the step count) is made of tensors when the
optimizer is made and updated in place under no_grad, so that `opt.step()` inside a traced step
is recorded like any in-place update: the parameters and the state, runtime inputs of the traced
function (arguments, or tensors read from the optimizer object), are updated in the compiled call.
Reading a parameter's `.grad` goes through `current_tensor`, which finds an argument's stand-in in
the trace (where the traced backward put the gradient).

PyTorch's implementation options are taken: `foreach` and `capturable` change nothing here (the
update is the same; the step count is always a tensor) and `differentiable=True` is refused (the
update runs under no_grad). An eager `step()` is one compiled call from the third on (from the
first with `fused=True`; never with `fused=False`): the same update traced once (`tr.trace`), its
floats (lr, betas, ...) runtime inputs, instead of a dozen eager operations per parameter, each
~100x slower than the compiled update -- for a training loop whose step is not traced as a whole
(the model alone traced, as with torch.compile(model), or nothing traced). The first two run
eagerly, so that a script that steps once or twice does not wait for a compile.
"""
from __future__ import annotations

import builtins
import warnings
from typing import Callable, Iterable

import tracer
from tracer.context import AbsentNamesNoted, enable_grad, no_grad, state as mode
from tracer.errors import ArgumentError, TracerWarning, TracingError
from tracer.ir.types import float64, is_float
from tracer.backward import clear_grads
from tracer.creation import zeros, zeros_like
from tracer.interop import loaded_tensor
from tracer.tensor import Tensor
from tracer.tracing import current_tensor


# The traced update of each optimizer, made by the eager step that first runs it, or the number of
# eager steps run so far before that, or EAGER; left out when the optimizer pickles (it holds
# native code).
class _Updates:
    """FUSED_UPDATES[optimizer]: kept in the optimizer's own __dict__ (left out when it pickles or
    copies), not in a WeakKeyDictionary, whose value -- a traced function that holds the
    optimizer, its argument -- would keep its key, and the parameters and state, alive for good."""
    NAME = "_tracer_update"

    def get(self, optimizer, default=None):
        return vars(optimizer).get(self.NAME, default)

    def __getitem__(self, optimizer):
        return vars(optimizer)[self.NAME]

    def __contains__(self, optimizer) -> bool:
        return self.NAME in vars(optimizer)

    def __setitem__(self, optimizer, value) -> None:
        vars(optimizer)[self.NAME] = value

    def pop(self, optimizer, default=None):
        return vars(optimizer).pop(self.NAME, default)


FUSED_UPDATES = _Updates()
EAGER_STEPS = 2  # eager steps before the compiled update (unless fused=True)
COMPILED_SIGNATURES = 2  # signatures of the update compiled before it runs eagerly for good
EAGER = "eager"


class Optimizer(AbsentNamesNoted):
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
        named = [isinstance(p, tuple) for p in params]
        if any(named):  # (name, parameter) pairs, as model.named_parameters() gives (PyTorch 2.13)
            if not all(named):
                raise ArgumentError("all optimizer params should be with/without names; some "
                                    "param names are missing")
            group["param_names"] = [name for name, _ in params]
            params = [p for _, p in params]
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
        # a fused step traced before this group would leave its parameters out: trace again
        FUSED_UPDATES.pop(self, None)
        for p in params:
            self.state[p] = self._initial_state(p, group)

    def _initial_state(self, parameter: Tensor, group: dict) -> dict[str, Tensor]:
        return {}

    def __getstate__(self) -> dict:
        return {k: v for k, v in vars(self).items() if k != _Updates.NAME}

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
                    if name != "step" and own[name].dtype != parameter.dtype:
                        # PyTorch's load_state_dict casts the state but the step to the
                        # parameter's dtype (NAdam's float32 mu_product, ASGD's eta and mu)
                        own[name] = zeros_like(own[name], dtype=parameter.dtype)
                    own[name].copy_(value)

    def zero_grad(self, set_to_none: builtins.bool = True) -> None:
        clear_grads((p for group in self.param_groups for p in group["params"]), set_to_none)

    def step(self, closure: Callable | None = None):
        """One update of every parameter that has a gradient; `closure` recomputes the loss."""
        loss = None
        if closure is not None:
            with enable_grad():
                loss = closure()
        self._complete_state()
        fused = [group.get("fused") for group in self.param_groups]
        update = FUSED_UPDATES.get(self, 0)
        if mode.trace is not None or False in fused or update is EAGER:
            self._update_all()
        elif isinstance(update, int) and update < EAGER_STEPS and not all(fused):
            self._update_all()
            FUSED_UPDATES[self] = update + 1
        else:
            if isinstance(update, int):  # (tr.trace, which the package imports on first use)
                update = FUSED_UPDATES[self] = tracer.trace(self._update_all)
            try:
                update()
            except TracingError as error:
                if all(fused):
                    raise
                # (an update that decides from the values, written by the user: tracing it
                # failed before anything changed)
                warnings.warn(f"{type(self).__name__}.step() runs eagerly: its update could not "
                              f"be compiled ({error}); pass fused=False to say so",
                              TracerWarning, stacklevel=2)
                FUSED_UPDATES[self] = EAGER
                self._update_all()
                return loss
            if not all(fused) and update.cache_info().misses > COMPILED_SIGNATURES:
                # the update keeps changing (the parameters that have a .grad vary from step to
                # step: a mixture of experts, layers used on some steps): eager from now on
                FUSED_UPDATES[self] = EAGER
        return loss

    def _complete_state(self) -> None:
        """Make the state that hyperparameters changed since call for (SGD's momentum set after the
        optimizer was made, as PyTorch makes it; RMSprop's centered and Adam's amsgrad, where
        PyTorch raises KeyError), zeros, before the update runs: a traced update cannot store
        tensors it makes. (Not inside a traced step, where the state made would be traced values:
        `_update_all` says what to do there.)"""
        if mode.trace is not None:
            return
        for group in self.param_groups:
            params = group["params"]
            if not params:
                continue
            # (the names the group's hyperparameters call for, from an empty stand-in)
            names = self._initial_state(zeros(0, dtype=params[0].dtype), group).keys()
            for parameter in params:
                state = self.state[parameter]
                if not names <= state.keys():
                    for name, tensor in self._initial_state(parameter, group).items():
                        state.setdefault(name, tensor)

    def _update_all(self) -> None:
        with no_grad():
            for group in self.param_groups:
                for parameter in group["params"]:
                    current = current_tensor(parameter)
                    if current.grad is None:
                        continue
                    try:
                        self._update(current, current.grad, self.state[parameter], group)
                    except KeyError as error:
                        if mode.trace is None:
                            raise
                        raise TracingError(
                            f"{type(self).__name__}.step() in a traced function: a parameter's "
                            f"state has no {error}, which a hyperparameter changed after the "
                            f"optimizer was made calls for; run one step() outside the traced "
                            f"function first (it makes that state), or make the optimizer with "
                            f"that hyperparameter") from None

    def _update(self, parameter: Tensor, grad: Tensor, state: dict, group: dict) -> None:
        raise NotImplementedError


def _step_count() -> Tensor:
    # float64, so that the bias corrections beta ** step (and Adagrad's decayed learning rate) are
    # computed as PyTorch computes them (in Python floats) for float32 parameters too.
    return zeros((), dtype=float64)


def _implementation(**options) -> dict:
    """PyTorch's implementation options of an optimizer (those its PyTorch namesake takes, kept
    in the defaults as PyTorch keeps them), checked as PyTorch checks them."""
    if options.get("fused") and options.get("foreach"):
        raise ArgumentError("`fused` and `foreach` cannot be `True` together")
    if options.get("differentiable"):
        raise ArgumentError("differentiable=True is not supported: the update runs under "
                            "no_grad; to differentiate through an update, write it with tensor "
                            "operations")
    return options


def _require_not_negative(**hyperparameters: float) -> None:
    for name, value in hyperparameters.items():
        if value < 0:
            raise ArgumentError(f"{name} must not be negative, got {value}")


def _gradient(parameter: Tensor, grad: Tensor, group: dict, l2: builtins.bool = True) -> Tensor:
    """The gradient an update follows: negated to maximize, plus weight_decay * parameter (an L2
    term) unless `l2` is False (AdamW decays the parameter itself)."""
    if group["maximize"]:
        grad = -grad
    if l2 and group["weight_decay"] != 0:
        grad = grad.add(parameter, alpha=group["weight_decay"])
    return grad


def _adam_moments(parameter: Tensor, grad: Tensor, state: dict,
                  group: dict) -> tuple[Tensor, Tensor, Tensor]:
    """Adam's and RAdam's common start: the weight decay (L2, or decoupled: the parameter shrinks
    by lr * weight_decay), the step counted, both moments updated; returns (step, exp_avg,
    exp_avg_sq)."""
    lr, (beta1, beta2), weight_decay = group["lr"], group["betas"], group["weight_decay"]
    decoupled = group["decoupled_weight_decay"]
    grad = _gradient(parameter, grad, group, l2=not decoupled)
    step = state["step"].add_(1)
    if decoupled and weight_decay != 0:
        parameter.mul_(1 - lr * weight_decay)
    exp_avg = state["exp_avg"].lerp_(grad, 1 - beta1)
    exp_avg_sq = state["exp_avg_sq"].mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    return step, exp_avg, exp_avg_sq
