"""The backward of one application of a custom Function (tracer/function.py): what the autodiff
pass calls, eagerly on arrays or traced into IR, to run the user's backward and take its gradients
as PyTorch's engine does."""
from __future__ import annotations

import contextlib
from typing import Callable

import numpy as np

from tracer.ir.builder import Builder
from tracer.autograd import delayed_error
from tracer.context import set_grad_enabled, state
from tracer.creation import zeros
from tracer.errors import FunctionBackwardError, HostValuesNeeded, definition_line
from tracer.named import Named
from tracer.tensor import Tensor
from tracer.tracing import tracing


class FunctionRule:
    """Runs the user's backward for one application of a custom Function."""

    def __init__(self, name: str, forward: Callable, backward: Callable, ctx,
                 arguments: list, outputs: list, differentiable: list[bool], trace,
                 given: int | None = None, on_host: Callable | None = None):
        self.name, self.user_backward, self.ctx = name, backward, ctx
        self.argument_names = ctx._argument_names  # forward's parameters after ctx, in order
        self.forward = forward  # for tr.trace(check_grads=True), which runs it again eagerly
        self.arguments = arguments
        # how many arguments apply() was given: the rest took their defaults and need no gradient
        self.given = len(arguments) if given is None else given
        # Per forward output: None for a non-tensor, else (shape, dtype, differentiable).
        flags = iter(differentiable)
        self.outputs = [(o.shape, o.dtype, next(flags)) if isinstance(o, Tensor) else None
                        for o in outputs]
        self.trace = trace
        # traced, a backward that reads tensor values runs on the host: on_host(rule, builder,
        # cotangents, needs) emits it (tracer/host_function.py)
        self.on_host = on_host

    def __call__(self, builder: Builder, cotangents: list, needs: list[bool]) -> list:
        """Cotangents (one per differentiable output) in, one gradient handle per tensor input out."""
        tensor_positions = [i for i, a in enumerate(self.arguments) if isinstance(a, Tensor)]
        needs_by_argument = [False] * len(self.arguments)
        for position, need in zip(tensor_positions, needs):
            needs_by_argument[position] = need
        self.ctx.needs_input_grad = Named(self.argument_names, needs_by_argument)
        if self.trace is None:
            return self._run(builder, cotangents, tensor_positions)
        try:
            with tracing(self.trace), self.trace.emitting_into(builder):
                return self._run(builder, cotangents, tensor_positions)
        except HostValuesNeeded:
            if self.on_host is None:
                raise
            return self.on_host(self, builder, cotangents, needs)

    def _wrap(self, handle) -> Tensor:
        if isinstance(handle, Tensor):  # a backward that records its graph (create_graph)
            return handle
        return Tensor._make(handle, self.trace, False)

    def _run(self, builder: Builder, cotangents: list, tensor_positions: list[int]) -> list:
        context = self.trace.label(f"{self.name}.backward") if self.trace else contextlib.nullcontext()
        # (with create_graph, eagerly it records onto the tape; traced, its IR is differentiated
        # again, but for what it computes under no_grad, see dispatch.apply)
        with set_grad_enabled(state.creating_graph), context:
            grads_in: list[Tensor | None] = []
            flowing = iter(cotangents)
            for output in self.outputs:
                if output is None:  # not a tensor: None, as in PyTorch
                    grads_in.append(None)
                    continue
                shape, dtype, differentiable = output
                handle = next(flowing) if differentiable else None
                if handle is None and self.ctx.materialize_grads:
                    grads_in.append(zeros(*shape, dtype=dtype))
                else:
                    grads_in.append(None if handle is None else self._wrap(handle))
            result = self.user_backward(self.ctx, *grads_in)
            if state.creating_graph and getattr(self.user_backward, "once_differentiable", False):
                results = list(result) if isinstance(result, (tuple, list)) else [result]
                result = delayed_error(self.name, f"{self.name}.backward", [
                    r if isinstance(r, Tensor) else None for r in results],
                    [a for a in self.arguments if isinstance(a, Tensor)])
                result = [d if isinstance(r, Tensor) else r for r, d in zip(results, result)]
        return self._check(builder, result, tensor_positions)

    def _check(self, builder: Builder, result, tensor_positions: list[int]) -> list:
        """The handles of the gradients `result` returned, as PyTorch's engine takes them: one
        of a shape the input's broadcasts to is summed down to it, one of another dtype cast."""
        where = f"{self.name}.backward"
        line = definition_line(self.user_backward)
        results = list(result) if isinstance(result, (tuple, list)) else [result]
        expected = self.given
        # PyTorch accepts extra trailing Nones (here also for arguments left to their defaults).
        while len(results) > expected and results[-1] is None:
            results.pop()
        if len(results) < len(self.arguments) and len(results) >= expected:
            results += [None] * (len(self.arguments) - len(results))
        if len(results) != len(self.arguments):
            raise FunctionBackwardError(
                f"{where} returned {len(results)} gradient(s) but apply() was given {expected} "
                f"input(s) ({', '.join(self.argument_names[:expected])}); return one per input, "
                f"None for inputs that need no gradient", line)
        handles = []
        for position, (name, argument, gradient) in enumerate(
                zip(self.argument_names, self.arguments, results)):
            if gradient is None:
                if position in tensor_positions:
                    handles.append(None)
                continue
            if not isinstance(argument, Tensor):
                raise FunctionBackwardError(
                    f"{where} returned a gradient for argument '{name}', which is not a tensor; "
                    f"return None in its place", line)
            if not isinstance(gradient, Tensor):
                raise FunctionBackwardError(
                    f"{where} returned a {type(gradient).__name__} as the gradient of '{name}'; "
                    f"return a tensor or None", line)
            if not _broadcasts_to(argument.shape, gradient.shape):
                raise FunctionBackwardError(
                    f"{where} returned a gradient for '{name}' of shape {list(gradient.shape)}; "
                    f"expected shape {list(argument.shape)} (or one it broadcasts to)", line)
            handle = (gradient._handle if self.trace else gradient if state.creating_graph
                      else gradient._eager_array("backward"))
            handle = builder.sum_to_shape(handle, argument.shape)
            if gradient.dtype != argument.dtype:
                handle = builder.cast(handle, argument.dtype)
            handles.append(handle)
        return handles


def _broadcasts_to(shape: tuple[int, ...], target: tuple[int, ...]) -> bool:
    try:
        return np.broadcast_shapes(shape, target) == tuple(target)
    except ValueError:
        return False
