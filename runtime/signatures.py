"""The compiled signatures of one traced function: least recently used first out, one compile per
signature however many threads ask for it, and why each recompile happened.

A signature key is `(structure, leaf signatures, grad mode)` as `TracedFunction._key` builds it:
the structure is the argument tree with static values in place, a leaf signature is
("T", shape, dtype, requires_grad, .grad signature, alias) for a Tensor, ("A", shape, dtype, alias)
for a numpy array, ("I",) or ("F",) for a Python number. A variant of a signature (the tensors
the function read from outside its arguments now have other .grad states, say) is cached under
the key with a fourth element, that state.

TRACER_CACHE_LIMIT (default 64) bounds the signatures kept per function, as torch._dynamo's
cache_size_limit does: past it, the least recently used one is dropped (its native code is freed
once no call is running it) and a `CacheLimitWarning` says why the function kept recompiling.
"""
from __future__ import annotations

import threading
from collections import Counter, OrderedDict
from typing import Any, Callable, Sequence

import numpy as np

from tracer.errors import CacheLimitWarning, RecompileWarning, warn_at_user_line
from tracer.runtime.recompiles import RecompileMonitor
from tracer.runtime.settings import count_setting

DEFAULT_LIMIT = 64
_FIELDS = {"T": ("kind", "shape", "dtype", "requires_grad", ".grad", "alias"),
           "A": ("kind", "shape", "dtype", "alias")}
_KIND_NAMES = {"T": "Tensor", "A": "numpy array", "I": "int", "F": "float"}


def recompile_reason(previous: tuple | None, key: tuple, leaf_paths: Sequence[str]) -> str:
    """Why signature `key` needed its own compile, compared with the signature `previous` (the
    most recently used one): "; "-separated "what: before -> after" phrases, e.g.
    "shape of x: (3, 4) -> (5, 4)". Empty if the keys are equal (then something the function
    reads outside its arguments changed; see `TracedFunction`)."""
    if previous is None:
        return "first call"
    # (a key may carry a fourth element, a variant: see SignatureCache.lookup)
    (old_structure, old_leaves, old_grad), (structure, leaves, grad) = previous[:3], key[:3]
    differences = []
    if old_grad != grad:
        differences.append(f"grad mode: {_enabled(old_grad)} -> {_enabled(grad)}")
    if old_structure != structure:
        # the root is ("tuple", (positional arguments, keyword arguments))
        for old_part, new_part, path in zip(old_structure[1], structure[1],
                                            ("the positional arguments", "the keyword arguments")):
            if old_part != new_part:
                differences.append(_structure_difference(old_part, new_part, path))
    elif old_leaves != leaves:
        for path, old, new in zip(leaf_paths, old_leaves, leaves):
            differences += _leaf_differences(path, old, new)
    return "; ".join(differences)


def _enabled(flag: bool) -> str:
    return "enabled" if flag else "disabled"


def _leaf_differences(path: str, old: tuple, new: tuple) -> list[str]:
    if old[0] != new[0]:
        return [f"type of {path}: {_KIND_NAMES[old[0]]} -> {_KIND_NAMES[new[0]]}"]
    differences = []
    for field, before, after in zip(_FIELDS.get(new[0], ()), old, new):
        if before == after:
            continue
        if field == "alias":  # the index of the first leaf that is the same object
            differences.append(f"aliasing of {path}: object #{before} -> #{after}")
        elif field == "dtype":  # keys hold dtype codes ('<f4')
            differences.append(f"dtype of {path}: {np.dtype(before).name} -> "
                               f"{np.dtype(after).name}")
        else:
            differences.append(f"{field} of {path}: {_show(before)} -> {_show(after)}")
    return differences


def _show(value: Any) -> str:
    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[1], str):
        return f"shape {value[0]}, dtype {np.dtype(value[1]).name}"  # a .grad signature
    return str(value)


def _structure_difference(old: tuple, new: tuple, path: str) -> str:
    """The first place where two argument structures differ."""
    if old[0] == new[0] == "static":
        return f"static value of {path}: {old[1]!r} -> {new[1]!r}"
    old_children, new_children = _children(old), _children(new)
    if (old[0] != new[0] or old_children is None or len(old_children) != len(new_children)
            or (old[0] == "dict" and old[1] != new[1])):
        return f"structure of {path}: {_describe(old)} -> {_describe(new)}"
    names = old[1] if old[0] == "dict" else range(len(old_children))
    for name, child_old, child_new in zip(names, old_children, new_children):
        if child_old != child_new:
            child = (f"argument {name}" if path == "the positional arguments" else name
                     if path == "the keyword arguments" else f"{path}[{name!r}]")
            return _structure_difference(child_old, child_new, child)
    return f"type of {path}: {old[-1].__name__} -> {new[-1].__name__}"  # named tuples


def _children(node: tuple) -> tuple | None:
    return node[2] if node[0] == "dict" else node[1] if node[0] in ("list", "tuple") else None


def _describe(node: tuple) -> str:
    children = _children(node)
    if children is not None:
        return f"{node[0]} of {len(children)}"
    return {"static": "static value", "leaf": "tensor or number"}[node[0]]


class _Building:
    """A signature that one thread builds and others wait for: its entry, or the error that
    building it raised. (Not concurrent.futures.Future, whose import took ~1.5 ms of every fresh
    process's tr.trace.)"""

    def __init__(self) -> None:
        self._done = threading.Event()
        self._entry: Any = None
        self._error: BaseException | None = None

    def set_result(self, entry: Any) -> None:
        self._entry = entry
        self._done.set()

    def set_exception(self, error: BaseException) -> None:
        self._error = error
        self._done.set()

    def result(self) -> Any:
        self._done.wait()
        if self._error is not None:
            raise self._error
        return self._entry


class SignatureCache:
    """`lookup` returns the entry of a signature key, building it on a miss: the first thread to
    miss builds it while later threads wait for that result (the lock is never held while
    building, nor while the native code runs). Entries are kept in least-recently-used order."""

    def __init__(self, name: str):
        self.name = name
        self.entries: OrderedDict[tuple, Any] = OrderedDict()
        # quick key -> (full key, its entry): a hit hashes only the small quick key
        self._quick: dict[tuple, tuple[tuple, Any]] = {}
        # the quick key last found, with its (full key, entry): a loop calling one signature
        # compares its quick key with this one, item by item (the same dtype objects compare by
        # identity), instead of hashing it (a numpy dtype's hash is computed on every call)
        self._last_quick: tuple | None = None
        self._latest: tuple | None = None  # the last key of `entries` (the most recently used)
        self._building: dict[tuple, _Building] = {}
        self._lock = threading.Lock()
        self.hits = self.misses = 0
        self._reasons: Counter[str] = Counter()  # "what changed" -> recompiles it caused
        self._warned = False
        self._recompiles = RecompileMonitor(name)

    def clear(self) -> None:
        with self._lock:
            self.entries.clear()
            self._quick.clear()
            self._last_quick = None
            self._latest = None
            self.hits = self.misses = 0
            self._reasons.clear()
            self._warned = False
            self._recompiles.clear()

    def quick(self, quick_key: tuple, count: bool) -> Any | None:
        """The entry a quick key was last seen with, if it is still cached and its `check()` says
        it still applies (else the caller looks the call up in full, which says why not)."""
        with self._lock:
            last = self._last_quick
            if last is not None and last[0] == quick_key:
                found = last[1]
            else:
                found = self._quick.get(quick_key)
                if found is None:
                    return None
                self._last_quick = (quick_key, found)
            key, entry = found
            if entry.check is not None and not entry.check():
                return None
            if key is not self._latest:  # calls of one signature in a row leave the order as is
                self.entries.move_to_end(key)
                self._latest = key
            self.hits += count
            return entry

    def lookup(self, key: tuple, leaf_paths: Sequence[str], build: Callable[[], Any],
               stale: Callable[[Any], str], count: bool, quick_key: tuple | None = None,
               variant: Callable[[Any], tuple | None] = lambda entry: None) -> Any:
        """The entry for `key` (counted as a hit or a miss if `count`). `stale(entry)` says why a
        cached entry may not be used (empty: it may); `build(reason)` makes a new one.
        `variant(entry)` of a stale entry is what differs that may be part of the key (the
        state of the tensors the function read from outside its arguments), or None: then
        the entry is replaced, else kept beside the one for `key + (variant,)`."""
        with self._lock:
            entry = self.entries.get(key)
            if entry is None:
                key = self._compatible(key)
                entry = self.entries.get(key)
            reason = stale(entry) if entry is not None else ""
            difference = variant(entry) if reason else None
            if difference is not None:
                key = (*key, difference)
                entry = self.entries.get(key)
                reason = stale(entry) if entry is not None else reason
            if entry is not None and not reason:
                self.entries.move_to_end(key)
                self._latest = key
                self.hits += count
                self._remember(quick_key, key, entry)
                return entry
            if not reason:
                previous = next(reversed(self.entries), None)
                reason = recompile_reason(previous, key, leaf_paths)
            pending = self._building.get(key)
            building = pending is None
            if building:
                pending = self._building[key] = _Building()
        if not building:
            entry = pending.result()  # another thread's build of the same signature (or its error)
            with self._lock:
                self.hits += count
            return entry
        try:
            entry = build(reason)
        except BaseException as error:
            pending.set_exception(error)
            raise
        finally:
            with self._lock:
                del self._building[key]
        with self._lock:
            if key in self.entries:  # a stale entry replaced: no quick key may still find it
                self._forget(key)
            self.entries[key] = entry
            self.entries.move_to_end(key)
            self._latest = key
            self.misses += count
            self._remember(quick_key, key, entry)
            storm = ""
            if reason != "first call":
                self._reasons.update(part.split(":")[0] for part in reason.split("; "))
                storm = self._recompiles.note(reason)
            warning = self._evict(reason)
        pending.set_result(entry)
        if storm:
            warn_at_user_line(storm, RecompileWarning)
        if warning:
            warn_at_user_line(warning, CacheLimitWarning)
        return entry

    def _compatible(self, key: tuple) -> tuple:
        """The key of a cached entry that runs calls of signature `key` too: one that differs
        only in whether argument tensors whose .grad its trace did not read have a .grad (a
        step that starts with zero_grad()); else `key`."""
        structure, leaves, grad_mode = key
        for other, entry in reversed(self.entries.items()):
            if other[0] != structure or other[2] != grad_mode or len(other) != 3 or (
                    len(other[1]) != len(leaves)):
                continue
            unread = getattr(entry, "unread", ())
            if all(mine == theirs or (
                    index in unread and mine[0] == theirs[0] == "T" and mine[:4] == theirs[:4]
                    and mine[5] == theirs[5] and None in (mine[4], theirs[4]))
                   for index, (mine, theirs) in enumerate(zip(leaves, other[1]))):
                return other
        return key

    def _remember(self, quick_key: tuple | None, key: tuple, entry: Any) -> None:
        if quick_key is not None:
            found = self._quick[quick_key] = (key, entry)
            self._last_quick = (quick_key, found)

    def _forget(self, key: tuple) -> None:
        self._quick = {q: found for q, found in self._quick.items() if found[0] != key}
        if self._last_quick is not None and self._last_quick[1][0] == key:
            self._last_quick = None

    def _evict(self, reason: str) -> str:
        """Drop the least recently used entries past the limit; the warning to give, if any."""
        limit = count_setting("TRACER_CACHE_LIMIT", DEFAULT_LIMIT)
        if len(self.entries) <= limit:
            return ""
        while len(self.entries) > limit:
            evicted, _ = self.entries.popitem(last=False)
            self._forget(evicted)
        if self._warned:
            return ""
        self._warned = True
        causes = ", ".join(f"{what} changed ({count} times)"
                           for what, count in self._reasons.most_common())
        return (f"{self.name} was compiled for more than TRACER_CACHE_LIMIT={limit} signatures; "
                f"the least recently used ones are evicted (and compiled again if called again). "
                f"It recompiled because: {causes or 'nothing recorded'}. Latest: {reason}")
