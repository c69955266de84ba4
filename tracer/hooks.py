"""`Tensor.register_hook` and `Tensor.retain_grad`, eager and traced.

Eagerly a hook hangs on the tape: on the node output that computes the tensor, or on the
accumulator of a leaf, and the engine calls it with the tensor's whole gradient. Traced, the trace
keeps the hooks by value, and the autodiff pass calls them when it has that value's cotangent, so
the hook's own operations become part of the compiled backward.
"""
from __future__ import annotations

import weakref
from typing import Callable

from tracer.autograd import edge_of, ordered
from tracer.errors import ArgumentError
from tracer.tensor import Tensor


class RemovableHandle:
    """What register_hook returns: `.remove()` takes the hook away again."""

    def __init__(self, hooks: list, hook: Callable):
        self._hooks, self._hook = hooks, hook

    def remove(self) -> None:
        if any(h is self._hook for h in self._hooks):
            self._hooks.remove(self._hook)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.remove()


def hook_runners(trace) -> dict[int, Callable]:
    """For the autodiff pass: by id of a traced value, a function (builder, cotangent) -> the
    cotangent after the hooks registered on it, which are traced into `builder`'s instructions."""
    def runner(hooks: list[Callable]) -> Callable:
        def run(builder, cotangent):
            with trace.emitting_into(builder):
                for hook in ordered(hooks):
                    result = hook(Tensor._make(cotangent, trace, False))
                    if result is not None:
                        cotangent = trace.handle_of(result)
            return cotangent
        return run
    return {key: runner(hooks) for key, hooks in trace.gradient_hooks.items() if hooks}


def _hook_list(tensor: Tensor) -> list:
    if tensor._trace is not None:
        handle = tensor._trace.handle_of(tensor)
        return tensor._trace.gradient_hooks.setdefault(id(handle), [])
    if tensor._node is None:
        return edge_of(tensor).hooks  # a leaf: its accumulator's
    node = tensor._node
    if node.hooks is None:
        node.hooks = {}
    return node.hooks.setdefault(tensor._output_index, [])


class HookMethods:
    """Tensor.register_hook and Tensor.retain_grad (given to Tensor by tracer/methods.py)."""

    def register_hook(self, hook: Callable) -> RemovableHandle:
        """Call `hook(grad)` with this tensor's gradient whenever a backward computes it; if it
        returns a tensor, that is the gradient that goes on (and into `.grad`)."""
        if not self.requires_grad:
            raise ArgumentError("register_hook on a tensor that does not require grad")
        hooks = _hook_list(self)
        hooks.append(hook)
        return RemovableHandle(hooks, hook)

    def retain_grad(self) -> None:
        """Keep this non-leaf tensor's gradient in its `.grad` at backward (leaves always do)."""
        if not self.requires_grad:
            raise ArgumentError("retain_grad on a tensor that does not require grad")
        if self.is_leaf or any(getattr(h, "retains_grad", False) for h in _hook_list(self)):
            return
        reference = weakref.ref(self)

        def keep(grad: Tensor) -> None:
            tensor = reference()
            if tensor is not None:
                tensor.grad = grad if tensor.grad is None else tensor.grad + grad

        keep.retains_grad = True
        _hook_list(self).append(keep)
