"""Why a traced function compiles again: the difference between a call's signature key and the
keys it already has, in words ("x: shape (3,) -> (4,)").

A key is `(structure, leaf signatures, grad mode)` as `TracedFunction._key` makes it: the
structure holds the static values, and each leaf signature is ("T", shape, dtype, requires_grad,
grad signature, alias position) for a Tensor, ("A", shape, dtype, alias position) for an array,
("I",) or ("F",) for a Python number.
"""
from __future__ import annotations

from typing import Any, Callable, Iterable, Sequence

import numpy as np

_KINDS = {"T": "a Tensor", "A": "an array", "I": "a Python int", "F": "a Python float"}


def _statics(structure) -> list:
    """The static values of a structure, in order."""
    if not isinstance(structure, tuple) or not structure:
        return []
    if structure[0] == "static":
        return [structure[1]]
    found = []
    for part in structure[1:]:
        if isinstance(part, tuple):
            for item in part:
                found += _statics(item)
    return found


def dtype_name(code: str) -> str:
    """'float32' for the dtype code '<f4' that signatures hold."""
    return np.dtype(code).name


def type_text(shape, dtype: str) -> str:
    return f"{dtype_name(dtype)}{list(shape)}"


def _leaf_differences(name: str, new: tuple, old: tuple) -> list[str]:
    if new[0] != old[0]:
        return [f"{name}: {_KINDS[old[0]]} -> {_KINDS[new[0]]}"]
    if new[0] in ("I", "F"):
        return []
    differences = []
    if new[1] != old[1]:
        differences.append(f"{name}: new shape {tuple(old[1])} -> {tuple(new[1])}")
    if new[2] != old[2]:
        differences.append(f"{name}: new dtype {dtype_name(old[2])} -> {dtype_name(new[2])}")
    if new[0] == "T":
        if new[3] != old[3]:
            differences.append(f"{name}: requires_grad {old[3]} -> {new[3]}")
        if new[4] != old[4]:
            before = "absent" if old[4] is None else type_text(*old[4])
            after = "absent" if new[4] is None else type_text(*new[4])
            differences.append(f"{name}.grad: {before} -> {after}")
    if new[-1] != old[-1]:
        differences.append(f"{name}: now the same object as another argument"
                           if new[-1] < old[-1] else f"{name}: no longer shared with another "
                           f"argument")
    return differences


def key_differences(new: tuple, old: tuple, leaf_names: Sequence[str]) -> list[str]:
    """Everything that differs between two signature keys, one phrase each."""
    (structure, leaves, grad_mode), (old_structure, old_leaves, old_grad_mode) = new, old
    differences = []
    if grad_mode != old_grad_mode:
        differences.append(f"grad mode {'enabled' if grad_mode else 'disabled'} "
                           f"(was {'enabled' if old_grad_mode else 'disabled'})")
    if structure != old_structure:
        statics, old_statics = _statics(structure), _statics(old_structure)
        if len(statics) == len(old_statics) and len(leaves) == len(old_leaves):
            differences += [f"new static value {b!r} (was {a!r})"
                            for a, b in zip(old_statics, statics)
                            if a != b or type(a) is not type(b)]
        if not differences or len(leaves) != len(old_leaves):
            differences.append("new structure of the arguments (their number, nesting, keywords "
                               "or static values)")
        if len(leaves) != len(old_leaves):
            return differences
    for name, leaf, old_leaf in zip(leaf_names, leaves, old_leaves):
        differences += _leaf_differences(name, leaf, old_leaf)
    return differences


def recompile_reason(key: tuple, existing: Iterable[tuple], leaf_names: Sequence[str]) -> str:
    """Why `key` compiles: its differences from the closest existing key (fewest differences)."""
    best: list[str] | None = None
    for old in existing:
        differences = key_differences(key, old, leaf_names)
        if differences and (best is None or len(differences) < len(best)):
            best = differences
    if best is None:
        return "first call"
    return "; ".join(best)


def rebound_reason(guards: Sequence[tuple[str, Callable[[], Any], Any]],
                   same: Callable[[Any, Any], bool], captured_changed: bool) -> str:
    """Why an existing signature traces again: the names it reads from its globals or closure
    that now hold another value, or a captured tensor of another type."""
    names = [name for name, read, traced in guards if not same(read(), traced)]
    reasons = [f"rebound global or closure variable {name!r}" for name in names]
    if captured_changed:
        reasons.append("a tensor it reads from outside changed shape, dtype or requires_grad")
    return "; ".join(reasons) or "what it reads from outside changed"
