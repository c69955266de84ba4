"""Custom autograd functions, R torch style: `tr.autograd_function(forward=f, backward=b)`, whose
backward returns a dict of gradients by argument name; built on `tracer.function.apply_function`."""
from __future__ import annotations

import inspect
from typing import Callable

from tracer.errors import FunctionBackwardError
from tracer.errors import definition_line
from tracer.function import apply_function


class autograd_function:
    """R torch's `autograd_function(forward = ..., backward = ...)`: call it like a function.

    `backward(ctx, *grad_outputs)` returns a dict of gradients by argument name (missing: None).
    """

    def __init__(self, forward: Callable, backward: Callable, name: str | None = None):
        self.forward = forward
        self.user_backward = backward
        self.name = name or getattr(forward, "__name__", "autograd_function")
        if self.name == "<lambda>":
            self.name = "autograd_function"
        self.argument_names = list(inspect.signature(forward).parameters)[1:]

    def _backward(self, ctx, *grad_outputs):
        result = self.user_backward(ctx, *grad_outputs)
        if not isinstance(result, dict):
            raise FunctionBackwardError(
                f"{self.name}.backward must return a dict of gradients by argument name "
                f"(e.g. {{'input': grad}}), got {type(result).__name__}",
                definition_line(self.user_backward))
        unknown = set(result) - set(self.argument_names)
        if unknown:
            raise FunctionBackwardError(
                f"{self.name}.backward returned gradients for {sorted(unknown)}, which are not "
                f"arguments of forward ({', '.join(self.argument_names)})",
                definition_line(self.user_backward))
        return tuple(result.get(name) for name in self.argument_names)

    def __call__(self, *args, **kwargs):
        return apply_function(self.name, self.forward, self._backward, args, kwargs)

