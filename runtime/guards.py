"""Guards: what a traced function reads besides its arguments, and whether that has changed since
it was traced, in which case the signature traces again (as torch.compile's guards do).

Before tracing, everything the function can reach is walked once (runtime/reach.py). For every
path that ends at a tensor the function then captured, the guard checks that the path still
reaches that very tensor (`model.w = new_tensor` traces again); for every path that ends at a
Python int, string, None or numpy array, that it still holds the value seen before tracing (a
module's `n_heads = 4`, baked into the code; floats are runtime inputs, runtime/floats.py), or
at a function or class, that it is the same one, as is the class of every object on a path and
the length (keys) of every list or tuple (dict); that no attribute the user's code may read
where absent when traced (`getattr(model, "temperature", 1.0)`, `try: self.temperature` /
`except AttributeError`, an unset __slots__ slot), nor one hiding what the user's class defines
(`block.act = f`), was set on a user's object since, nor one the trace asked of tracer's own
objects and found absent (`getattr(self.linear, "scale", 1.0)` on a tr.nn layer, an optimizer,
a scheduler: noted as asked, tracer.context.AbsentNamesNoted); where the user's code builds the
names it reads (`getattr(self, f"act{i}")`), that no name at all was set on a user's object; if a
Module ran, that no forward hook was added or removed since. Captured tensors are runtime inputs,
read on every call; their shape, dtype, requires_grad and .grad are checked too. A tensor reached
otherwise (returned by a method, say) is guarded by identity: rebinding it is unseen.
"""
from __future__ import annotations

import functools
import numbers
from types import MappingProxyType
from typing import TYPE_CHECKING, AbstractSet, Any, Callable, Sequence

import numpy as np

from tracer.buffers import state_of
from tracer.errors import project_file
from tracer.runtime.code_names import UsedNames, attributes_read, may_read
from tracer.runtime.reach import (Reached, answers_absent, library_file, named_steps, shadowed,
                                  slot_names)
from tracer.runtime.floats import decided, decides as floats_decides, read_source as floats_source
from tracer.tensor import Tensor

if TYPE_CHECKING:
    from tracer.runtime.entry import Entry

# (what to call it, the object its path starts at, the steps from there: ("attr" | "item", key),
# the value when traced)
Guard = tuple[str, Any, tuple, Any]


def captured_state(tensors: Sequence[Tensor]) -> list[tuple]:
    """What the compiled code assumes of each captured tensor."""
    return [state_of(t) for t in tensors]


def guards_for(reached: Reached, captured: Sequence[Tensor], used: UsedNames | None,
               runtime: Sequence[str] = ()) -> list[Guard]:
    """The guards of a signature whose trace captured `captured`: every path to those tensors,
    and the paths to other values whose attribute names and dict keys are all in `used` (the
    names and string constants of the code that ran while tracing; None: all paths), but those
    of the floats that are runtime inputs (`runtime`, by name: runtime/floats.py guards them).
    A container whose size the trace changed is not guarded so: a list the function appends to
    (a log of its calls) grows only while tracing, as other state it changes, and is no reason
    to trace again on every call.

    Where a method of the user's reads attributes of its `self` by names it builds
    (`getattr(self, f"act{i}")`, UsedNames.building_names), which of that object's attributes it
    read is not known: all count as read, and the number of names on it is guarded (see
    `_absences`)."""
    runtime = set(runtime)
    built = _building(reached, used.building_names(_not_users) if used is not None else ())
    if built:  # (not the private ones, a Module's `_modules` and the like: no f-string's)
        used = used.assuming(frozenset(
            name for value in built.values() if hasattr(value, "__dict__")
            for name in vars(value) if not name.startswith("_")))
    paths = [(path, tensor) for tensor in captured for path in reached.paths.get(id(tensor), ())]
    paths += [(path, value) for path, value in reached.values if path[0] not in runtime
              and (used is None or may_read(named_steps(path[2]), value, used))
              and (not path[2] or path[2][-1][0] not in _SIZES or _size_now(path) == value)]
    paths += _absences(reached, used, built)
    if reached.hook_changes is not None and (used is None or used.read("_forward_hooks", "attr")):
        from tracer.nn.module_api import HOOK_CHANGES  # (imported: a Module was reached)
        label = "forward hooks or module methods"
        paths.append(((label, HOOK_CHANGES, (("attr", "hook_changes"),)), reached.hook_changes))
    return [(*path, value) for path, value in paths if path[2]]  # a root is itself


def _building(reached: Reached, codes: AbstractSet) -> dict[int, Any]:
    """The user's objects (by id) whose class has a method among `codes`: those whose attributes
    that method reads by names it builds."""
    if not codes:
        return {}
    return {id(value): value for _, value in reached.namespaces
            if not isinstance(value, type) and any(
                getattr(member, "__code__", None) in codes
                for klass in type(value).__mro__ for member in vars(klass).values())}


def _absences(reached: Reached, used: UsedNames | None, built: dict[int, Any]
              ) -> list[tuple[tuple, Any]]:
    """Guards that names stay unset where the code may read them: on each user's object,
    settings, module or class the walk reached (Reached.namespaces), the names absent there now
    that the user's code may read where absent (by a string: getattr with a default, hasattr; or
    inside a try that catches AttributeError: UsedNames.maybe_absent), and those that would hide
    what its class defines that the code names (`block.scale = 3` over the class's `scale`,
    `block.act = f` over the method); on tracer's own objects (a Module, an optimizer: not
    namespaces, for cost), the names the trace asked of them and found absent
    (Reached.absent_reads). One guard an object (see `_absence`); where the code builds the
    names it reads (`built`, by id), more: the length of its dict (and of a Module's registries)
    stays the one it has now, whatever name is set."""
    by_string = used.maybe_absent(_not_users) if used is not None else frozenset()
    guards: list[tuple[tuple, Any]] = []
    for path, value in reached.namespaces:
        if used is not None and path[2] and not may_read(named_steps(path[2]), value, used):
            continue
        if id(value) in built:  # (by length: a name set where none was grows it, cheapest)
            own = getattr(value, "__dict__", None)
            guards += [((f"{path[0]}.{name} length", path[1],
                         (*path[2], ("attr", name), ("length", None))), len(getattr(value, name)))
                       for name in ("__dict__", *_REGISTRIES)
                       if isinstance(own, (dict, MappingProxyType))
                       and (name == "__dict__" or isinstance(own.get(name), dict))]
        wanted = by_string | _getters_reads(type(value), by_string) | frozenset(
            name for name in shadowed(value) if used is None or name in used)
        if used is not None and answers_absent(type(value)):  # (any name it lacks it may serve)
            wanted |= used.attributes_loaded(_not_users)
        guards += _absence(path, value, wanted, by_string)
        if id(value) in reached.names_then:
            guards += _made_while_tracing(path, value, reached.names_then[id(value)], used)
    through_dicts = used.read_through_dicts(_not_users) if used is not None else frozenset()
    for path, value in reached.own_objects if through_dicts else ():
        guards += _absence(path, value, through_dicts, frozenset())
    asked: dict[int, tuple[Any, set[str]]] = {}
    for owner, name in reached.absent_reads:
        asked.setdefault(id(owner), (owner, set()))[1].add(name)
    for owner, names in asked.values():
        guards += _absence((f"a {type(owner).__name__}'s", owner, ()), owner, names, names)
    return guards


def _getters_reads(cls: type, names: AbstractSet[str]) -> frozenset[str]:
    """The attributes the getters of the properties of `cls` among `names` read: a property
    read where absent (`getattr(self, "temperature", 1.0)`) is absent where its getter reads an
    absent attribute (`return self._temperature`), whose AttributeError passes through it."""
    getters = (getattr(member, "fget", getattr(member, "func", None))
               for member in (getattr(cls, name, None) for name in names)
               if isinstance(member, (property, functools.cached_property)))
    return frozenset().union(*(attributes_read(getter) for getter in getters
                               if getter is not None and not _not_users(
                                   getattr(getattr(getter, "__code__", None), "co_filename", ""))))


def _made_while_tracing(path: tuple, value, names_then: frozenset[str], used: UsedNames | None
                        ) -> list[tuple[tuple, Any]]:
    """Guards of the numbers, strings and Nones set on a user's object while tracing, under
    names the code names (a functools.cached_property computed, `self.n = 3` made lazily): the
    walk before tracing did not see them, and the compiled code may hold them (setting
    `model.factor = 7.0` over a cached 3.0 traces again)."""
    return [((f"{path[0]}.{name}", path[1], (*path[2], ("attr", name))), item)
            for name, item in list(vars(value).items())
            if name not in names_then and not name.startswith("__")
            and (used is None or name in used)
            and (item is None or isinstance(item, (numbers.Number, str)))]


def _absence(path: tuple, value, wanted: AbstractSet[str], by_name: AbstractSet[str]
             ) -> list[tuple[tuple, bool]]:
    """The guard (none, or one) that the names of `wanted` absent from `value` now stay so: each
    name not in its own dict (and, for those of `by_name`, not in a Module's registries, where
    its __setattr__ puts a Parameter, a buffer or a submodule read by its __getattr__:
    `model.temperature = Parameter(...)`), each slot of `wanted` not set (`getattr(self, "slot",
    1.0)` on a class with __slots__)."""
    own = getattr(value, "__dict__", None)
    if not isinstance(own, (dict, MappingProxyType)):  # (no keys() the guard could read)
        own = None
    every_slot = slot_names(type(value))
    slots = frozenset(name for name in every_slot if name in wanted and not hasattr(value, name))
    registries = [own[r] for r in _REGISTRIES if own is not None and isinstance(own.get(r), dict)]
    names = frozenset(name for name in wanted if own is not None and name not in own
                      and name not in every_slot and not any(name in r for r in registries))
    registered = names & by_name if len(registries) == len(_REGISTRIES) else frozenset()
    if not names and not slots:
        return []
    return [((f"{path[0]} attribute {', '.join(sorted(names | slots))}", path[1],
              (*path[2], ("absent", (names, registered, slots)))), True)]


# A Module's registries, where its __setattr__ puts a Parameter, a buffer or a submodule
_REGISTRIES = ("_parameters", "_buffers", "_modules")


def _absent(value, names: frozenset[str], registered: frozenset[str],
            slots: frozenset[str]) -> bool:
    """Whether none of `names` is set on `value`, nor of `registered` in its registries, nor any
    of its `slots` (an "absent" step of a guard)."""
    return ((not names or vars(value).keys().isdisjoint(names)) and all(
        getattr(value, registry).keys().isdisjoint(registered)
        for registry in _REGISTRIES if registered)
        and not any(hasattr(value, name) for name in slots))


def _absent_source(expression: str, names: frozenset[str], registered: frozenset[str],
                   slots: frozenset[str], label: str) -> str:
    """`_absent` as an expression of generated code: a test for each name (`"scale" in d`), as
    the few names a guard holds cost less so than by one isdisjoint (its views' allocation)."""
    target, own = f"object{label}", f"own{label}"
    tests = [f"{name!r} in {own}" for name in sorted(names)]
    tests += [f"{name!r} in {target}.{registry}" for registry in _REGISTRIES
              for name in sorted(registered)]
    tests += [f"hasattr({target}, {name!r})" for name in sorted(slots)]
    if names:
        tests[0] = f"{sorted(names)[0]!r} in ({own} := ({target} := {expression}).__dict__)"
    else:
        tests[0] = f"hasattr(({target} := {expression}), {sorted(slots)[0]!r})"
    return f"not ({' or '.join(tests)})"


def _not_users(filename: str) -> bool:
    """Whether code in `filename` is a library's or tracer's own (whose strings name their own
    attributes)."""
    return library_file(filename) or project_file(filename)


def stored_tensors(reached: Reached, trace, inputs: Sequence[Tensor]) -> list[tuple[str, Tensor]]:
    """(path, tensor) where the traced function left tensors of its trace other than its `inputs`
    (the tensors it captured): state made while tracing, which the compiled code cannot store."""
    inputs_seen = {id(t) for t in inputs}
    return [(reached.paths[key][0][0], tensor) for key, tensor in reached.tensors.items()
            if trace.owns(tensor) and key not in inputs_seen]


def captured_names(reached: Reached, captured: Sequence[Tensor]) -> list[str]:
    """What to call each captured tensor in messages: the first path found to it."""
    return [reached.paths[id(t)][0][0] if id(t) in reached.paths else f"captured tensor {k}"
            for k, t in enumerate(captured)]


def compile_check(guards: Sequence[Guard], captured: Sequence[Tensor], unread: Sequence[bool],
                  floats: Sequence = ()) -> Callable[[], bool] | None:
    """One function, True while every guard holds, every captured tensor has the state it had
    when traced (see `state_matches`; `unread[k]`: the trace did not read the .grad of captured
    tensor k) and every float input is still a float that decides as traced (floats.read_source).
    Generated Python source, as torch.compile's guards are: a call to it costs a fraction of
    walking the guards one by one, and it runs on every call. None where there is nothing to
    check: a call then calls nothing."""
    namespace: dict[str, Any] = {"Tensor": Tensor, "state_of": state_of}
    lines = []
    for number, (_, root, steps, traced) in enumerate(guards):
        namespace[f"root{number}"] = root
        expression = f"root{number}"
        for step, (kind, key) in enumerate(steps):
            if kind in _SIZES:
                expression = f"{_SIZES[kind]}({expression})"
            elif kind == "absent":
                expression = _absent_source(expression, *key, f"{number}_{step}")
            elif kind == "attr" and key.isidentifier():
                expression += f".{key}"
            else:
                namespace[f"key{number}_{step}"] = key
                expression = (f"getattr({expression}, key{number}_{step})" if kind == "attr"
                              else f"{expression}[key{number}_{step}]")
        namespace[f"value{number}"], namespace[f"type{number}"] = traced, type(traced)
        lines.append(f"value = {expression}")
        if isinstance(traced, (Tensor, np.ndarray)) or traced is None:
            lines.append(f"if value is not value{number}: return False")
        elif traced != traced:  # NaN
            lines.append(f"if type(value) is not type{number} or value == value: return False")
        else:
            lines.append(f"if type(value) is not type{number} or value != value{number}: "
                         f"return False")
    for number, (tensor, state, free) in enumerate(zip(captured, captured_state(captured),
                                                        unread)):
        namespace.update({f"tensor{number}": tensor, f"state{number}": state,
                          f"head{number}": state[:3], f"grad{number}": state[3]})
        if not free:
            lines.append(f"if state_of(tensor{number}) != state{number}: return False")
        else:  # any .grad, or the one a parameter of the compiled code was made for
            lines.append(f"now = state_of(tensor{number})")
            lines.append(f"if now[:3] != head{number} or (now[3] is not None and grad{number} is "
                         f"not None and now[3] != grad{number}): return False")
    float_lines, _ = floats_source(floats, namespace)
    lines += float_lines
    if not lines:
        return None
    body = "".join(f"        {line}\n" for line in lines)
    source = (f"def check():\n    try:\n{body}        return True\n"
              f"    except Exception:\n        return False\n")
    exec(compile(source, "<tracer guards>", "exec"), namespace)
    return namespace["check"]


def state_matches(now: tuple, traced: tuple, unread: bool) -> bool:
    """Whether a captured tensor's state `now` may run code traced with it in state `traced`:
    the same, or, where the trace did not read the .grad, the same but for the .grad (none, or
    the one the code has a parameter for)."""
    if not unread:
        return now == traced
    return now[:3] == traced[:3] and (now[3] is None or traced[3] is None or now[3] == traced[3])


def _read(root, steps: tuple):
    value = root
    for kind, key in steps:
        value = (_SIZE_OF[kind](value) if kind in _SIZES else getattr(value, key)
                 if kind == "attr" else _absent(value, *key) if kind == "absent" else value[key])
    return value


def _size_now(path: tuple):
    try:
        return _read(path[1], path[2])
    except Exception:  # (gone since the walk: the guard fails, and the next call traces again)
        return None


# How a guard reads the size of a container (reach._SIZES)
_SIZES = {"length": "len", "keys": "tuple"}
_SIZE_OF = {"length": len, "keys": tuple}


def _same(current, traced) -> bool:
    if isinstance(traced, (Tensor, np.ndarray)) or traced is None:
        return current is traced
    return type(current) is type(traced) and (
        current == traced or (current != current and traced != traced))  # NaN is NaN


def captured_variant(entry: Entry) -> tuple | None:
    """The state of the entry's captured tensors if it differs from when they were traced (a
    .grad made or cleared that the trace read): a signature of its own, kept beside this one, as
    for arguments."""
    now = captured_state(entry.captured)
    outcomes = decided(entry.floats, current=True)
    if outcomes == decided(entry.floats, current=False) and all(
            map(state_matches, now, entry.captured_state, entry.unread_captured)):
        return None
    return (tuple(state if not unread else (*state[:3], None)
                  for state, unread in zip(now, entry.unread_captured)), outcomes)


def captured_change(entry: Entry) -> str:
    """What the entry was traced with outside its arguments and has changed since (a recompile
    reason, as `signatures.recompile_reason` gives), or "" if nothing has."""
    if entry.check is None or entry.check():
        return ""
    for name, traced, now, unread in zip(entry.captured_names, entry.captured_state,
                                         captured_state(entry.captured), entry.unread_captured):
        if not state_matches(now, traced, unread):
            return state_change(name, traced, now)
    for name, root, steps, traced in entry.guards:
        try:
            current = _read(root, steps)
        except Exception:
            return f"{name}: removed"
        if not _same(current, traced):
            if steps[-1][0] == "absent":
                return f"{name}: set since the trace (absent then, or its class's)"
            return f"{name}: {_value_change(traced, current)}"
    for float_input in entry.floats:
        try:
            current = _read(float_input.root, float_input.steps)
        except Exception:
            return f"{float_input.name}: removed"
        if not isinstance(current, float):
            return f"{float_input.name}: float -> {type(current).__name__}"
        for comparison, bound, outcome in float_input.decisions:
            if floats_decides(comparison, current, bound) != outcome:
                return (f"{float_input.name}: {float_input.value!r} -> {current!r} (the traced "
                        f"code branched on whether it is {_SYMBOLS[comparison]} {bound!r})")
    return "something read outside the arguments"


_SYMBOLS = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}


def state_change(name: str, traced: tuple, now: tuple) -> str:
    """What differs between two states of a captured tensor (see `captured_state`)."""
    fields = ("shape", "dtype", "requires_grad")
    differences = [f"{field} of {name}: {before} -> {after}"
                   for field, before, after in zip(fields, traced, now) if before != after]
    if traced[3] != now[3]:
        def grad(state):
            return "None" if state is None else f"shape {state[0]}, dtype {state[1]}"
        differences.append(
            f".grad of {name}: {grad(traced[3])} -> {grad(now[3])} (the traced code reads the "
            f".grad it is called with: backward() accumulates into it, or a test of `.grad is "
            f"None`)")
    return "; ".join(differences)


def _value_change(traced, current) -> str:
    if isinstance(traced, (Tensor, np.ndarray)) or traced is None or current is None:
        return "rebound" if type(current) is type(traced) else (
            f"{type(traced).__name__} -> {type(current).__name__}")
    return f"{traced!r} -> {current!r}"
