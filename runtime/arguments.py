"""A traced function's arguments at call time: flattening argument and result trees into
leaves (Tensors, numpy arrays, Python numbers) and a hashable structure, each leaf's signature, the
arrays a call passes to the compiled code, and the checks on the buffers it writes back into."""
from __future__ import annotations

import math
import numbers
from typing import TYPE_CHECKING, Collection, Mapping, Sequence

import numpy as np

from tracer.buffers import buffer_of, grad_buffer_of, is_traced, state_of, tensor_buffers, view_of
from tracer.errors import ArgumentError, InplaceError
from tracer.interop import foreign_to_numpy, is_foreign_array
from tracer.dtypes import as_dtype
from tracer.tensor import Tensor

if TYPE_CHECKING:
    from tracer.runtime.entry import Entry


LEAF = ("leaf",)  # a runtime leaf's place in a structure


def _is_runtime_leaf(value) -> bool:
    return isinstance(value, (Tensor, np.ndarray)) or (
        isinstance(value, numbers.Number) and not isinstance(value, (bool, np.bool_)))


def flatten(tree, leaves: list, path: str, static_ints: frozenset[str] = frozenset()) -> tuple:
    """Append the runtime leaves of `tree` to `leaves` (with their paths); return its hashable
    structure, in which static values (not arrays, not numbers, and ints at the paths in
    `static_ints`) stand for themselves."""
    if _is_runtime_leaf(tree) and not (path in static_ints and isinstance(tree, numbers.Integral)):
        leaves.append((tree, path))
        return LEAF
    if isinstance(tree, (list, tuple)):
        kind = "list" if isinstance(tree, list) else "tuple"
        items = tuple(flatten(item, leaves, f"{path}_{i}", static_ints)
                      for i, item in enumerate(tree))
        if hasattr(tree, "_fields"):  # a named tuple comes back as one
            return (kind, items, type(tree))
        return (kind, items)
    if isinstance(tree, dict):
        return ("dict", tuple(tree), tuple(flatten(v, leaves, f"{path}_{k}", static_ints)
                                           for k, v in tree.items()))
    if is_foreign_array(tree):  # a torch tensor is hashable, but its values change: never static
        leaves.append((foreign_to_numpy(tree, f"argument {path}"), path))
        return LEAF
    try:
        hash(tree)
    except TypeError:
        raise ArgumentError(f"argument {path} of type {type(tree).__name__} is neither a tensor, a "
                            f"number nor a hashable static value") from None
    return ("static", tree, type(tree))


def unflatten(structure: tuple, leaves: Sequence):
    kind = structure[0]
    if kind in ("tuple", "list") and len(structure) == 2 and (
            structure[1].count(LEAF) == len(structure[1])):  # the common results: a flat sequence
        return tuple(leaves) if kind == "tuple" else list(leaves)
    iterator = iter(leaves)

    def build(node):
        kind = node[0]
        if kind == "leaf":
            return next(iterator)
        if kind == "static":
            return node[1]
        if kind == "dict":
            return {k: build(v) for k, v in zip(node[1], node[2])}
        items = [build(item) for item in node[1]]
        if len(node) == 3:
            return node[2](*items)
        return items if kind == "list" else tuple(items)

    return build(structure)


def leaf_signature(value, position: dict[int, int]) -> tuple:
    if isinstance(value, Tensor):
        if is_traced(value):
            raise ArgumentError("a traced tensor escaped its trace and was passed to a traced "
                                "function; return tensors from traced functions instead")
        shape, dtype, requires_grad, grad = state_of(value)
        grad_signature = None if grad is None else (grad[0], grad[1].str)
        alias = position.setdefault(id(value), len(position))
        return ("T", shape, dtype.str, requires_grad, grad_signature, alias)
    if isinstance(value, np.ndarray):
        as_dtype(value.dtype)
        return ("A", value.shape, value.dtype.str, position.setdefault(id(value), len(position)))
    return ("I",) if isinstance(value, numbers.Integral) else ("F",)


def parameter_name(path: str) -> str:
    return "".join(c if c.isalnum() or c == "_" else "_" for c in path) or "arg"


def call_arrays(entry: "Entry", values: Sequence) -> list[np.ndarray]:
    """The arrays a call of `entry` passes to its compiled code; `values` are the argument leaves,
    the captured tensors and the floats read from outside."""
    if entry.tensors_in_order:
        return tensor_buffers(values)
    return parameter_arrays(entry.parameter_sources, values, entry.zeros)


def parameter_arrays(sources: Sequence[tuple[str, int]], values: Sequence,
                     zeros: Mapping[int, np.ndarray] | None = None) -> list[np.ndarray]:
    """The arrays a call passes to the compiled code, one per parameter (see Entry); `values` are
    the argument leaves followed by the captured tensors. `zeros` holds, by parameter position,
    read-only zeros that stand for a .grad that is None (see `zeros_for`)."""
    arrays = []
    for position, (kind, index) in enumerate(sources):
        value = values[index]
        if kind == "leaf":
            arrays.append(buffer_of(value))
        elif kind == "grad":
            grad = grad_buffer_of(value)
            # none, where the signature does not depend on it (see Trace.writebacks): a buffer
            # for the .grad the call makes
            if grad is None:
                grad = zeros.get(position) if zeros else None
                if grad is None:
                    grad = np.zeros_like(buffer_of(value))
            arrays.append(grad)
        else:
            arrays.append(np.array(value, np.int64 if isinstance(value, numbers.Integral)
                                   else np.float64))
    return arrays


# Read-only zeros kept per compiled signature up to this size each; a larger .grad buffer is
# allocated per call (where the call's work dwarfs it) rather than held for the program's life.
SHARED_ZEROS_BYTES = 1 << 16


def zeros_for(sources: Sequence[tuple[str, int]], parameters: Sequence[tuple[tuple, np.dtype]],
              written: Collection[int]) -> dict[int, np.ndarray]:
    """Zeros, by parameter position, to pass for a .grad that is None (`sources` as for
    `parameter_arrays`; `parameters` the compiled code's shapes and dtypes): one array per
    parameter, made once instead of on every call, read-only, for the parameters that the
    code only reads (not those in `written`, which it writes in place: their array becomes the
    new .grad) and that are at most SHARED_ZEROS_BYTES."""
    zeros = {}
    for position, ((kind, _), (shape, dtype)) in enumerate(zip(sources, parameters)):
        if (kind == "grad" and position not in written
                and math.prod(shape) * dtype.itemsize <= SHARED_ZEROS_BYTES):
            array = zeros[position] = np.zeros(shape, dtype)
            array.flags.writeable = False
    return zeros


def check_targets(entry: Entry, values: Sequence, arrays: list) -> None:
    """Before running: every buffer the call writes back into is writeable and shares no memory
    with another argument (the traced function treated them as separate values)."""
    separate = None  # decided at the first target (a call making every .grad anew has none)
    for index, kind, _ in entry.writebacks:
        value = values[index]
        target = buffer_of(value) if kind == "data" else grad_buffer_of(value)
        if target is None:
            continue  # a new .grad array is made
        name = entry.leaf_names.get(index, f"number {index}") + ("" if kind == "data" else ".grad")
        if kind == "data" and view_of(value) is not None:
            raise InplaceError(
                f"the traced function changes {name} in place, the result of {view_of(value)}; "
                f"here that result is a copy, not a view, so the change would not reach the "
                f"tensor it came from. Assign into that tensor instead (x[0] = x[0] + 1), or "
                f"pass a clone()")
        if not target.flags.writeable:
            raise ArgumentError(f"the traced function changes {name} in place, but its numpy "
                                f"buffer is read-only")
        if separate is None:
            # Arrays that own their memory (no base) and are distinct objects cannot overlap:
            # the cheap common case, decided once for every target (`w.grad = w.detach()` makes
            # one array both w and its .grad).
            separate = (all(a.base is None for a in arrays)
                        and len(set(map(id, arrays))) == len(arrays))
        if separate:
            continue
        source = ("leaf" if kind == "data" else "grad", index)
        own = entry.parameter_sources.index(source) if source in entry.parameter_sources else -1
        for position, other in enumerate(arrays):
            if position != own and (other is target or np.may_share_memory(target, other)):
                raise ArgumentError(
                    f"the traced function changes {name} in place, and it shares memory with "
                    f"another argument or .grad; pass separate tensors (e.g. a .clone())")


def copy_arrays(tree, instead: dict | None = None):
    """`tree` with its numpy arrays copied (Tensors, with their version counters, are kept);
    `instead`: by id, an array to give for one (already a copy)."""
    if isinstance(tree, np.ndarray):
        return instead[id(tree)] if instead and id(tree) in instead else tree.copy()
    if isinstance(tree, (list, tuple)):
        return type(tree)(copy_arrays(item, instead) for item in tree)
    if isinstance(tree, dict):
        return {key: copy_arrays(value, instead) for key, value in tree.items()}
    return tree
