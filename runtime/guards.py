"""Guards: what a traced function reads outside its arguments (tensors, arrays and numbers in its
globals and closure, and the tensors it captured) and whether that has changed since it was
traced, in which case the signature traces again (as torch.compile's guards do)."""
from __future__ import annotations

import numbers
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from tracer.tensor import Tensor

if TYPE_CHECKING:
    from tracer.runtime.trace import Entry


def captured_types(tensors: Sequence[Tensor]) -> list[tuple]:
    return [(t.shape, t.dtype, t.requires_grad) for t in tensors]


def _is_guarded(value) -> bool:
    return isinstance(value, (Tensor, np.ndarray, numbers.Number))


def _same(current, traced) -> bool:
    if isinstance(traced, (Tensor, np.ndarray)):
        return current is traced
    return type(current) is type(traced) and (current == traced or current != current)


def scope_guards(function: Callable) -> list[tuple[str, Callable[[], Any], Any]]:
    """Guards on the tensors, arrays and numbers `function` reads from its module's globals and
    from its closure (not those of the functions it calls)."""
    code = getattr(function, "__code__", None)
    if code is None:
        return []
    guards = []
    namespace = getattr(function, "__globals__", {})
    for name in code.co_names:
        if _is_guarded(namespace.get(name)):
            guards.append((f"global {name}", lambda name=name: namespace.get(name),
                           namespace[name]))
    for name, cell in zip(code.co_freevars, getattr(function, "__closure__", None) or ()):
        try:
            value = cell.cell_contents
        except ValueError:  # not bound yet
            continue
        if _is_guarded(value):
            guards.append((f"closure variable {name}", lambda cell=cell: cell.cell_contents, value))
    return guards


def captured_change(entry: Entry) -> str:
    """What the entry was traced with outside its arguments and has changed since (a recompile
    reason, as `signatures.recompile_reason` gives), or "" if nothing has."""
    if entry.captured and entry.captured_types != captured_types(entry.captured):
        return "shape, dtype or requires_grad of a tensor read outside the arguments"
    for name, read, traced in entry.guards:
        if not _same(read(), traced):
            return f"{name}: rebound"
    return ""
