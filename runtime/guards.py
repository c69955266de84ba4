"""Guards: what a traced function reads besides its arguments, and whether that has changed since
it was traced, in which case the signature traces again (as torch.compile's guards do).

Before tracing, everything the function can reach is walked once: the globals it names (and those
of the functions and methods it can call), its closure, its `self`, the objects passed to it as
static arguments, and from there attributes, list and dict items. For every path that ends at a
tensor the function then captured, the guard checks that the path still reaches that very tensor
(`model.w = new_tensor` traces again); for every path that ends at a Python number, string, None or
numpy array, that it still holds the value seen before tracing (a module's `p = 0.5`, baked into
the code); if a Module ran, that no forward hook was added or removed since. Captured tensors are
runtime inputs, read on every call; their shape, dtype, requires_grad and .grad are checked too. A
tensor reached otherwise (returned by a method, say) is guarded by identity: rebinding it is unseen.
"""
from __future__ import annotations

import argparse
import functools
import numbers
import os
import site
import sys
import types
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from tracer.buffers import state_of
from tracer.errors import project_file
from tracer.nn.module_api import HOOK_CHANGES, ModuleApi
from tracer.runtime.code_names import UsedNames, global_names, may_read
from tracer.runtime.random_draws import GENERATORS
from tracer.runtime.floats import decided, decides as floats_decides, read_source as floats_source
from tracer.tensor import Tensor

if TYPE_CHECKING:
    from tracer.runtime.entry import Entry

# (what to call it, the object its path starts at, the steps from there: ("attr" | "item", key),
# the value when traced)
Guard = tuple[str, Any, tuple, Any]

# The walk's bounds: deeper objects, longer containers and more objects than this are not looked
# into (a tensor found only there is guarded by identity only).
MAX_DEPTH = 8
MAX_ITEMS = 64
MAX_OBJECTS = 2000

# Objects of the standard library and of installed packages hold no user state worth guarding,
# nor do the globals of their code or of the project's own code (the project's objects, a
# tr.nn.Module or an optimizer, do).
@functools.cache
def _libraries() -> tuple[str, ...]:
    # The standard library's folder and site-packages (sysconfig's stdlib, purelib and platlib,
    # without importing sysconfig: 2.5 ms of a process's first trace)
    folders = [os.path.dirname(os.__file__), *site.getsitepackages()]
    return tuple({os.path.realpath(folder) + os.sep for folder in folders})


def _library_file(filename: str) -> bool:
    return filename.startswith(_libraries()) and not project_file(filename)


# The standard library's bags of settings, walked as a user's objects are: `args.lr` of
# argparse's parse_args(), a SimpleNamespace config.
_SETTINGS = (types.SimpleNamespace, argparse.Namespace)


def _user_module(module: types.ModuleType) -> bool:
    """A module of the user's own files (walked as an object: its settings are read as
    `config.scale`), not of a library or of this project."""
    filename = getattr(module, "__file__", None)
    return isinstance(filename, str) and not _library_file(filename) and not project_file(filename)


def _library_class(cls: type) -> bool:
    filename = getattr(sys.modules.get(cls.__module__), "__file__", None)
    if filename is None:  # a builtin, or the code typed into an interactive interpreter
        return cls.__module__ != "__main__"
    return _library_file(filename)


def captured_state(tensors: Sequence[Tensor]) -> list[tuple]:
    """What the compiled code assumes of each captured tensor."""
    return [state_of(t) for t in tensors]


@dataclass
class Reached:
    """What a walk found: every tensor and the paths to it, and the value at the end of every
    other guarded path; a path is (name, root, steps)."""
    tensors: dict[int, Tensor] = field(default_factory=dict)
    paths: dict[int, list[tuple]] = field(default_factory=dict)  # by id of the tensor
    values: list[tuple[tuple, Any]] = field(default_factory=list)
    # Python's and numpy's random generators, by id, with the name of the first path to each
    # (runtime/random_draws.py)
    generators: dict[int, tuple[str, Any]] = field(default_factory=dict)
    _seen: set[int] = field(default_factory=set)
    hook_changes: int | None = None  # HOOK_CHANGES.hook_changes if a Module was reached

    def floats(self) -> list[tuple[tuple, float]]:
        """The paths that end at a float (runtime inputs: see runtime/floats.py)."""
        return [(path, value) for path, value in self.values if isinstance(value, float)]


def reachable(function: Callable, static_arguments: Sequence[tuple[str, Any]]) -> Reached:
    """Walk what `function` (a function, bound method or callable object) and the objects passed
    to it as static arguments, named, can reach."""
    reached = Reached()
    _walk_callable(function, reached, 0, "self")
    for name, value in static_arguments:
        if not _is_value(value):
            _walk(value, (name, value, ()), reached, 0)
    return reached


def guards_for(reached: Reached, captured: Sequence[Tensor], used: UsedNames | None,
               runtime: Sequence[str] = ()) -> list[Guard]:
    """The guards of a signature whose trace captured `captured`: every path to those tensors,
    and the paths to other values whose attribute names and dict keys are all in `used` (the
    names and string constants of the code that ran while tracing; None: all paths), but those
    of the floats that are runtime inputs (`runtime`, by name: runtime/floats.py guards them)."""
    runtime = set(runtime)
    paths = [(path, tensor) for tensor in captured for path in reached.paths.get(id(tensor), ())]
    paths += [(path, value) for path, value in reached.values if path[0] not in runtime
              and (used is None or may_read(_named(path[2]), value, used))]
    if reached.hook_changes is not None and (used is None or used.read("_forward_hooks", "attr")):
        paths.append((("forward hooks", HOOK_CHANGES, (("attr", "hook_changes"),)), reached.hook_changes))
    return [(*path, value) for path, value in paths if path[2]]  # a root is itself


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
            if kind == "attr" and key.isidentifier():
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
        value = getattr(value, key) if kind == "attr" else value[key]
    return value


# A tr.nn.Module keeps its parameters, buffers and submodules in these dicts: a path through
# one is written as the user writes it (model.blocks[0].attn.weight).
_REGISTRIES = {("attr", "_parameters"), ("attr", "_buffers"), ("attr", "_modules")}


def _named(steps: tuple) -> tuple:
    """The steps whose names the code must have used to read by them: not the keys of a Module's
    registries, whose containers reach their items by iterating (Sequential's forward names no
    '1', yet `model[1].eval()` must trace again)."""
    return tuple(step for number, step in enumerate(steps)
                 if not (number and steps[number - 1] in _REGISTRIES))


def _child(path: tuple, kind: str, key) -> tuple:
    name, root, steps = path
    if kind == "item" and isinstance(key, str) and steps and steps[-1] in _REGISTRIES:
        name = name[:-len(steps[-1][1]) - 1]
        text = f"[{key}]" if key.isdigit() else f".{key}"
    else:
        text = (f".{key}" if kind == "attr" else f"[{key!r}]" if not isinstance(key, Tensor)
                else f"[<tensor of shape {list(key.shape)}>]")
    return f"{name}{text}", root, (*steps, (kind, key))


def _is_value(value) -> bool:
    return value is None or isinstance(value, (numbers.Number, str, np.ndarray))


def _walk(value, path: tuple, reached: Reached, depth: int) -> None:
    if isinstance(value, Tensor):
        reached.tensors[id(value)] = value
        reached.paths.setdefault(id(value), []).append(path)
        return
    if _is_value(value):
        reached.values.append((path, value))
        return
    if isinstance(value, ModuleApi) and reached.hook_changes is None:
        reached.hook_changes = HOOK_CHANGES.hook_changes
    if isinstance(value, GENERATORS):  # (and walked on: a user's subclass holds attributes)
        reached.generators.setdefault(id(value), (path[0], value))
    if isinstance(value, type):  # a user's class reached by name (`Config.scale`)
        _walk_class(value, reached, depth)
        return
    # A tuple is walked wherever it is reached: it is a value (an optimizer's defaults and each
    # of its param_groups hold the one betas tuple), and its items are guarded at every path.
    if (depth >= MAX_DEPTH or (id(value) in reached._seen and type(value) is not tuple)
            or len(reached._seen) >= MAX_OBJECTS
            or isinstance(value, (type, types.BuiltinFunctionType))
            or (isinstance(value, types.ModuleType) and not _user_module(value))):
        return
    if isinstance(value, (types.FunctionType, types.MethodType)):
        _walk_callable(value, reached, depth, path[0])
        return
    reached._seen.add(id(value))
    if isinstance(value, (list, tuple)):
        if len(value) <= MAX_ITEMS:
            for index, item in enumerate(value):
                _walk(item, _child(path, "item", index), reached, depth + 1)
    elif isinstance(value, dict):
        if len(value) <= MAX_ITEMS:
            for key, item in list(value.items()):
                if isinstance(key, (str, int, Tensor)):
                    _walk(item, _child(path, "item", key), reached, depth + 1)
    elif isinstance(value, types.ModuleType):  # a user's module: `import config; config.scale`
        for key, item in list(vars(value).items()):
            if not key.startswith("__"):
                _walk(item, _child(path, "attr", key), reached, depth + 1)
    elif hasattr(value, "python_function") and hasattr(value, "cache_info"):  # traced: its function
        _walk_callable(value.python_function, reached, depth, path[0])
    elif hasattr(value, "__dict__") and (not _library_class(type(value))
                                         or isinstance(value, _SETTINGS)):
        for key, item in list(vars(value).items()):
            if not key.startswith("__"):
                _walk(item, _child(path, "attr", key), reached, depth + 1)
        _walk_class(type(value), reached, depth)


def _walk_callable(function, reached: Reached, depth: int, self_name: str) -> None:
    """The globals and closure of a function; the object and function of a bound method; the
    attributes and methods of a callable object."""
    if isinstance(function, types.MethodType):
        _walk(function.__self__, (self_name, function.__self__, ()), reached, depth + 1)
        function = function.__func__
    if not isinstance(function, types.FunctionType):
        if not isinstance(function, type):  # a callable object
            _walk(function, (self_name, function, ()), reached, depth)
        return
    if id(function) in reached._seen:
        return
    reached._seen.add(id(function))
    code = function.__code__
    if _library_file(code.co_filename) or project_file(code.co_filename):
        return
    namespace = function.__globals__
    for name in sorted(global_names(code)):
        if name in namespace:
            _walk(namespace[name], (f"global {name}", namespace, (("item", name),)),
                  reached, depth + 1)
    for name, cell in zip(code.co_freevars, function.__closure__ or ()):
        try:
            value = cell.cell_contents
        except ValueError:  # not bound yet
            continue
        _walk(value, (f"closure variable {name}", cell, (("attr", "cell_contents"),)),
              reached, depth + 1)


def _walk_class(cls: type, reached: Reached, depth: int) -> None:
    """What a user's class (an object's, or one reached by name) holds: the globals its methods
    read, and the numbers and strings in its body (`class Config: scale = 2.0`, read as
    `Config.scale` or `self.scale`), each by the path from the class itself."""
    if depth >= MAX_DEPTH:
        return
    for klass in cls.__mro__:
        if id(klass) in reached._seen or _library_class(klass):
            continue
        reached._seen.add(id(klass))
        for key, member in list(vars(klass).items()):
            function = getattr(member, "__func__", getattr(member, "fget", member))
            if isinstance(function, types.FunctionType):
                _walk_callable(function, reached, depth, "self")
            elif not key.startswith("__") and _is_value(member):  # (not a Function's
                # class-level list that a backward appends to: state, not configuration)
                _walk(member, (f"{klass.__qualname__}.{key}", klass, (("attr", key),)),
                      reached, depth + 1)


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
