"""Custom autograd Functions, PyTorch style (`class F(tr.Function)`; R torch's style,
`tr.autograd_function(forward=, backward=)`, is built on this in tracer/r_function.py).

`apply` runs the user's forward without recording gradients, then records one `custom_vjp` over its
outputs whose VJP is the user's backward. Eagerly that VJP runs when backward() reaches it; under
`@trace` the autodiff pass calls it, tracing the user's backward into ordinary IR at that point.
"""
from __future__ import annotations

import contextlib
import functools
import inspect
from typing import Callable

from tracer.ir.types import is_float
from tracer.ir.vjp import CustomRule
from tracer.autograd import attach, custom_node, edge_of
from tracer.context import is_grad_enabled, no_grad, recording_no_graph, state
from tracer.errors import ArgumentError, HostValuesNeeded, InplaceError
from tracer import host_function
from tracer.function_forward import inputs_kept, last_places, refuse_dirty_leaves
from tracer.function_rule import FunctionRule
from tracer.named import Named
from tracer.tensor import Tensor


class FunctionCtx:
    """The `ctx` of a custom Function: what forward leaves for backward."""

    def __init__(self, function_name: str, argument_names: list[str], needs_input_grad: list[bool]):
        self._function_name = function_name
        self._argument_names = argument_names
        self.needs_input_grad = Named(argument_names, needs_input_grad)
        self._saved: list[Tensor | None] = []
        self._saved_names: list[str | None] = []
        self._saved_versions: list[int] = []
        # per saved tensor, the base it is a view-copy of (PyTorch's view shares its version)
        # and that base's version, or None
        self._saved_bases: list[tuple[Tensor, int] | None] = []
        self._saved_aliases: list[tuple[int, Tensor, int]] = []  # (saved index, user's output, version)
        self._dirty: list[Tensor] = []
        self._non_differentiable: list[Tensor] = []
        self.materialize_grads = True
        self._trace = state.trace
        self._saved_handles: list = []

    def save_for_backward(self, *tensors, **named_values) -> None:
        """Keep tensors (or None) for backward by position (PyTorch), or any values by name
        (R torch, whose `ctx$save_for_backward(constant = constant)` saves a number)."""
        for t in tensors:
            if t is not None and not isinstance(t, Tensor):
                raise ArgumentError(f"save_for_backward takes tensors or None, got "
                                    f"{type(t).__name__}; keep other values as ctx attributes, "
                                    f"or save them by name (ctx.save_for_backward(n=n))")
        items = [(None, t) for t in tensors] + list(named_values.items())
        self._saved_names = [name for name, _ in items]
        self._saved = [t for _, t in items]

    def mark_dirty(self, *tensors: Tensor) -> None:
        self._dirty = list(tensors)

    def mark_non_differentiable(self, *tensors: Tensor) -> None:
        self._non_differentiable = list(tensors)

    def set_materialize_grads(self, value: bool) -> None:
        self.materialize_grads = bool(value)

    def _describe_saved(self, index: int) -> str:
        name = self._saved_names[index]
        tensor = self._saved[index]
        label = f"'{name}'" if name else f"number {index}"
        return f"saved tensor {label} (shape {list(tensor.shape)})"

    def check_saved(self) -> None:
        """Raise if a saved tensor was changed in place since it was saved (run when a backward
        that goes through this Function starts, as PyTorch does)."""
        for index, (t, version) in enumerate(zip(self._saved, self._saved_versions)):
            if isinstance(t, Tensor) and t._version != version:
                raise InplaceError(
                    f"{self._function_name}.backward: {self._describe_saved(index)} was changed "
                    f"in place at {t._changed_at} after it was saved for backward; change a clone "
                    f"of it instead, or mark the change with ctx.mark_dirty() in the forward")
        for index, base in enumerate(self._saved_bases):
            if base is not None and base[0]._version != base[1]:
                raise InplaceError(
                    f"{self._function_name}.backward: {self._describe_saved(index)} is a view of a "
                    f"tensor changed in place at {base[0]._changed_at} after it was saved for "
                    f"backward (a PyTorch view shares that change); change a clone of it instead")
        for index, output, version in self._saved_aliases:
            if output._version != version:
                raise InplaceError(
                    f"{self._function_name}.backward: {self._describe_saved(index)} is an output "
                    f"of the Function that was changed in place at {output._changed_at} after it "
                    f"was returned; change a clone of it instead")

    @property
    def saved_tensors(self) -> Named:
        if self._trace is None:
            self.check_saved()
            saved = list(self._saved)
            if state.creating_graph:
                # a saved output is the output returned (its graph goes through this Function)
                for index, output, _ in self._saved_aliases:
                    saved[index] = output
            return Named(self._saved_names, saved)
        # Traced, the backward is traced later, by the autodiff pass: it reads the values as they
        # were saved (check_saved ran when .backward() was called). One that records its graph
        # (create_graph) sees them requiring grad as eagerly, so that a Function it applies to
        # them records its own rule for the second derivative, as PyTorch's does.
        requiring = [state.creating_graph and isinstance(saved, Tensor) and saved.requires_grad
                     for saved in self._saved]
        for index, output, _ in self._saved_aliases:
            requiring[index] = state.creating_graph and output.requires_grad
        return Named(self._saved_names, [
            Tensor._make(h, self._trace, flag) if isinstance(saved, Tensor) else saved
            for saved, h, flag in zip(self._saved, self._saved_handles, requiring)])

    saved_variables = saved_tensors


def _bind(function_name: str, forward: Callable, args, kwargs) -> tuple[inspect.BoundArguments,
                                                                         int]:
    """forward's arguments, defaults filled in, and how many of them `apply` was given (PyTorch
    expects gradients for those only)."""
    signature = inspect.signature(forward)
    try:
        bound = signature.bind(None, *args, **kwargs)
    except TypeError as error:
        raise ArgumentError(f"{function_name}.apply: {error}") from None
    names = list(signature.parameters)
    given = max((names.index(name) for name in bound.arguments), default=0)
    bound.apply_defaults()
    return bound, given


def apply_function(name: str, forward: Callable, backward: Callable, args, kwargs,
                   runs_without_gradients: bool = True, keeps_zero: bool = False):
    """`Function.apply`: run `forward` untracked, then record its outputs as one custom_vjp
    (whose backward runs, on zeros, when no gradient reaches its outputs, as a custom Function's
    does in PyTorch, unless not `runs_without_gradients`)."""
    bound, given = _bind(name, forward, args, kwargs)
    argument_names = list(bound.arguments)[1:]
    arguments = list(bound.arguments.values())[1:]
    tensors = [a for a in arguments if isinstance(a, Tensor)]
    recording = is_grad_enabled() and any(t.requires_grad for t in tensors)
    ctx = FunctionCtx(name, argument_names,
                      [recording and isinstance(a, Tensor) and a.requires_grad for a in arguments])
    trace = state.trace
    # The gradient goes to the inputs as they were before forward, which may change them in place.
    handles_before = [t._handle if trace is None else trace.handle_of(t) for t in tensors]
    edges_before = [edge_of(t) for t in tensors] if trace is None else None
    labelled = trace.label(f"{name}.forward") if trace else contextlib.nullcontext()
    with inputs_kept(tensors) as watching:
        try:
            # (its own rule differentiates it, even inside a backward that records its graph:
            # its no_grad is no user's block that such a backward must cut, see dispatch.apply)
            with watching(), no_grad(), labelled, recording_no_graph():
                raw = forward(ctx, *arguments)
        except HostValuesNeeded:  # a forward that reads tensor values runs on the host
            return host_function.apply_on_host(name, forward, backward, functools.partial(
                FunctionCtx, name, argument_names, list(ctx.needs_input_grad)), arguments, given, trace)
        multiple = isinstance(raw, (tuple, list))
        outputs = list(raw) if multiple else [raw]
        for dirty in ctx._dirty:
            if not any(dirty is t for t in tensors):
                raise ArgumentError(f"{name}.forward: mark_dirty() was given a tensor that is "
                                    f"not an input of the Function")
        refuse_dirty_leaves(name, ctx._dirty)
    last = last_places(outputs, tensors, ctx._dirty)
    places = [p for p, o in enumerate(outputs) if isinstance(o, Tensor)]
    differentiable = [is_float(outputs[p].dtype) and last.get(id(outputs[p]), p) == p
                      and not any(outputs[p] is n for n in ctx._non_differentiable)
                      for p in places]
    recorded = [p for p, d in zip(places, differentiable) if d]
    if not recording or not recorded:
        results = [_fresh_output(o, tensors, ctx) for o in outputs]
        _remember_saved(ctx)
        return tuple(results) if multiple else results[0]
    rule = CustomRule(name, FunctionRule(name, forward, backward, ctx, arguments, outputs,
                                         differentiable, trace, given,
                                         host_function.backward_on_host),
                      runs_without_cotangents=runs_without_gradients, keeps_zero=keeps_zero)
    if trace is None:
        handles = [outputs[p]._handle for p in recorded]  # custom_vjp is the identity on them
        node = custom_node(name, rule, handles, handles_before, edges_before)
    else:
        attributes = {"num_outputs": len(recorded), "rule": rule}
        handles = trace.builder.emit(
            "custom_vjp", [outputs[p]._handle for p in recorded] + handles_before, attributes)
        trace.custom_calls.append((ctx, handles))
        node = None
    made = {place: _recorded_output(outputs[place], handle, index, node, trace, ctx)
            for index, (place, handle) in enumerate(zip(recorded, handles))}
    results = []
    for place, output in enumerate(outputs):  # a tensor returned at several places: one result
        shared = made.get(last.get(id(output), place))
        results.append(_fresh_output(output, tensors, ctx) if shared is None else shared)
    _alias_saved_outputs(ctx, outputs, results)
    _remember_saved(ctx)
    return tuple(results) if multiple else results[0]


def _recorded_output(output: Tensor, handle, index: int, node, trace, ctx) -> Tensor:
    if any(output is d for d in ctx._dirty):
        # The input changed in place becomes the output (PyTorch's mark_dirty).
        if trace is not None:
            output._handle = handle
        attach(output, node, index)
        return output
    return Tensor._make(handle, trace, True, node, index, leaf=False)


def _fresh_output(output, inputs, ctx):
    if isinstance(output, Tensor) and any(output is t for t in inputs) and not any(
            output is d for d in ctx._dirty):
        return output.detach()
    return output


def _alias_saved_outputs(ctx: FunctionCtx, outputs: list, results: list) -> None:
    """A saved forward output is returned to the user as another Tensor (sharing its buffer in
    eager mode): an in-place change to that one must also count as a change of the saved value."""
    ctx._saved_aliases = [
        (index, result, result._version)
        for index, saved in enumerate(ctx._saved)
        for raw, result in zip(outputs, results)
        if saved is not None and saved is raw and isinstance(result, Tensor) and result is not raw]


def _remember_saved(ctx: FunctionCtx) -> None:
    # Saved by name, a value may be anything (a number): only tensors have versions and handles.
    ctx._saved_versions = [t._version if isinstance(t, Tensor) else 0 for t in ctx._saved]
    ctx._saved_bases = [(t._view_base, t._view_base._version)
                        if isinstance(t, Tensor) and t._view_shares_version
                        and t._view_base is not None else None for t in ctx._saved]
    ctx._saved_handles = [None if not isinstance(t, Tensor) else t._handle if ctx._trace is None
                          or t._trace is ctx._trace else ctx._trace.handle_of(t)
                          for t in ctx._saved]
    if ctx._trace is not None:
        # A saved output is read as the output returned, whose gradient goes through this
        # Function again when the traced backward is differentiated (second order).
        for index, output, _ in ctx._saved_aliases:
            ctx._saved_handles[index] = output._handle


class Function:
    """Subclass with `@staticmethod forward(ctx, ...)` and `@staticmethod backward(ctx, *grads)`,
    then call `MyFunction.apply(...)`, as with `torch.autograd.Function`."""

    @staticmethod
    def forward(ctx, *args, **kwargs):
        raise NotImplementedError("a Function subclass must define forward(ctx, ...)")

    @staticmethod
    def backward(ctx, *grad_outputs):
        raise NotImplementedError("a Function subclass must define backward(ctx, *grad_outputs)")

    @staticmethod
    def setup_context(ctx, inputs: tuple, output) -> None:
        """PyTorch 2's style: define `forward(*args)` without ctx and this, which gets the inputs
        (after defaults) and forward's output, to fill ctx."""
        raise NotImplementedError

    @classmethod
    def apply(cls, *args, **kwargs):
        forward = cls.forward
        if cls.setup_context is not Function.setup_context:
            forward = _forward_with_setup_context(cls.forward, cls.setup_context)
        return apply_function(cls.__name__, forward, cls.backward, args, kwargs,
                              cls._runs_without_gradients, cls._keeps_zero)

    # PyTorch runs a custom Function's backward (on zero gradients) whenever it is on the way to
    # a leaf, even if no gradient reached its outputs (a Function before one whose backward
    # returned None): then its inputs' .grad become zeros, not None.
    _runs_without_gradients = True
    _keeps_zero = False  # (a backward that runs anyway)


class NativeFunction(Function):
    """A Function of this project's that computes one of PyTorch's own operations (acos, lerp,
    gelu, ...): like that operation's backward in PyTorch, its backward does not run when no
    gradient reaches its outputs, so what lies before it keeps a .grad of None."""

    _runs_without_gradients = False
    # Whether the operation's backward in PyTorch keeps a ZeroTensor cotangent one (a formula of
    # mul, div and add: ir.vjp.KEEPS_ZERO), so that its backward need not run on zeros.
    _keeps_zero = False


@functools.cache
def _forward_with_setup_context(forward: Callable, setup_context: Callable) -> Callable:
    """A `forward(ctx, ...)` made of a ctx-less forward and its setup_context."""
    def combined(ctx, *args):
        output = forward(*args)
        setup_context(ctx, args, output)
        return output
    parameters = list(inspect.signature(forward).parameters.values())
    combined.__signature__ = inspect.Signature(
        [inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD)] + parameters)
    combined.__name__ = getattr(forward, "__name__", "forward")
    return combined


def once_differentiable(backward: Callable) -> Callable:
    """PyTorch's decorator for a backward that is not itself differentiable: it runs without
    recording gradients, and a second-order gradient that would go through it is an error that
    names the Function (eager and traced)."""
    @functools.wraps(backward)
    def run_once(ctx, *grad_outputs):
        with no_grad():
            return backward(ctx, *grad_outputs)
    run_once.once_differentiable = True
    return run_once

