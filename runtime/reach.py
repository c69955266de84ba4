"""What a traced function can reach besides its arguments, walked once before tracing
(runtime/guards.py guards it): the globals it names (and those of the functions and methods it can
call), its closure, its `self`, the objects passed to it as static arguments, and from there
attributes, list and dict items and the numbers, strings and tuples in user classes' bodies.
Every path is (what to call it, the object it starts at, the steps from there: ("attr" | "item",
key))."""
from __future__ import annotations

import enum
import functools
import numbers
import os
import site
import sys
import types
from typing import Any, Callable, Sequence

import numpy as np

from tracer.context import noting_absent_reads
from tracer.errors import project_file
from tracer.runtime.code_names import global_names
from tracer.runtime.random_draws import GENERATORS
from tracer.tensor import Tensor

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


def library_file(filename: str) -> bool:
    # (the standard library's frozen modules -- importlib's bootstrap, posixpath -- run from
    # "<frozen posixpath>": their strings and names are theirs, as the others')
    return (filename.startswith(_libraries()) and not project_file(filename)
            or filename.startswith("<frozen "))


def _settings(value) -> bool:
    """One of the standard library's bags of settings, walked as a user's objects are: `args.lr`
    of argparse's parse_args(), a SimpleNamespace config. (argparse is asked only if imported:
    without it no Namespace exists, and importing it cost 3-4 ms of a fresh process's tr.trace.)"""
    argparse = sys.modules.get("argparse")
    return isinstance(value, types.SimpleNamespace) or (
        argparse is not None and isinstance(value, argparse.Namespace))


def _user_module(module: types.ModuleType) -> bool:
    """A module of the user's own files (walked as an object: its settings are read as
    `config.scale`), not of a library or of this project."""
    filename = getattr(module, "__file__", None)
    return isinstance(filename, str) and not library_file(filename) and not project_file(filename)


def _library_class(cls: type) -> bool:
    filename = getattr(sys.modules.get(cls.__module__), "__file__", None)
    if filename is None:  # a builtin, or the code typed into an interactive interpreter
        return cls.__module__ != "__main__"
    return library_file(filename)


class Reached:
    """What a walk found: every tensor and the paths to it, and the value at the end of every
    other guarded path; a path is (name, root, steps). (A plain class: @dataclass generating its
    methods took ~1 ms of a fresh process's tr.trace.)"""

    def __init__(self):
        self.tensors: dict[int, Tensor] = {}
        self.paths: dict[int, list[tuple]] = {}  # by id of the tensor
        self.values: list[tuple[tuple, Any]] = []
        # (path, object) of every user's object, settings, module and class the walk reached:
        # a name set on one later may change what the code reads there, one absent when traced
        # (`getattr(model, "temperature", 1.0)`) or one its class defines (`block.act = f`).
        # (Not tr.nn's layers and optimizers: a guard on each would cost a model's every call
        # more than all its others; what the trace asks of them is noted instead, below.)
        self.namespaces: list[tuple[tuple, Any]] = []
        # (object, name): what the traced function asked of tracer's own objects and found absent
        # (tracer.context.AbsentNamesNoted), noted while it was traced
        self.absent_reads: list[tuple[Any, str]] = []
        # (path, object) of tracer's own objects the walk reached, which `vars(layer).get(...)`
        # may read past their __getattr__
        self.own_objects: list[tuple[tuple, Any]] = []
        # The names in the dict of each user's object when walked, by id: a name set while
        # tracing (a functools.cached_property computed, `self.n = 3` made lazily) holds a value
        # the compiled code may have taken in, guarded then (guards._made_while_tracing).
        self.names_then: dict[int, frozenset[str]] = {}
        # Python's and numpy's random generators, by id, with the name of the first path to each
        # (runtime/random_draws.py)
        self.generators: dict[int, tuple[str, Any]] = {}
        self._seen: set[int] = set()
        self.hook_changes: int | None = None  # HOOK_CHANGES.hook_changes if a Module was reached

    def floats(self) -> list[tuple[tuple, float]]:
        """The paths that end at a float (runtime inputs: see runtime/floats.py)."""
        return [(path, value) for path, value in self.values if isinstance(value, float)]


def reachable(function: Callable, static_arguments: Sequence[tuple[str, Any]]) -> Reached:
    """Walk what `function` (a function, bound method or callable object) and the objects passed
    to it as static arguments, named, can reach."""
    reached = Reached()
    with noting_absent_reads(None):  # (its hasattr are not the traced function's)
        _walk_callable(function, reached, 0, "self")
        for name, value in static_arguments:
            if not _is_value(value):
                _walk(value, (name, value, ()), reached, 0)
    return reached


# What a path may end at whose identity is guarded: code the function may run.
_CODE = (type, types.FunctionType, types.MethodType, types.BuiltinFunctionType,
         functools.partial)

# A tr.nn.Module keeps its parameters, buffers and submodules in these dicts: a path through
# one is written as the user writes it (model.blocks[0].attn.weight).
_REGISTRIES = {("attr", "_parameters"), ("attr", "_buffers"), ("attr", "_modules")}


# Steps that end a path at the size of a container the code iterates: a list's or tuple's
# length, a dict's keys (`self.layers.append(block)` traces again).
_SIZES = {"length": "__len__()", "keys": "keys()"}


def named_steps(steps: tuple) -> tuple:
    """The steps whose names the code must have used to read by them: not a Module's registries,
    which its __getattr__ reads by a name in a tuple (`self.block.k` reads `_modules` so), nor
    their keys, whose containers reach their items by iterating (Sequential's forward names no
    '1', yet `model[1].eval()` must trace again)."""
    return tuple(step for number, step in enumerate(steps)
                 if step not in _REGISTRIES and not (number and steps[number - 1] in _REGISTRIES)
                 and step != ("attr", "__class__")  # (read by calling the object's methods)
                 and step[0] not in _SIZES)


def _child(path: tuple, kind: str, key) -> tuple:
    name, root, steps = path
    if kind in _SIZES:  # (the guard reads len(list) or tuple(dict) there)
        return f"{name}.{_SIZES[kind]}", root, (*steps, (kind, None))
    if kind == "item" and isinstance(key, str) and steps and steps[-1] in _REGISTRIES:
        name = name[:-len(steps[-1][1]) - 1]
        text = f"[{key}]" if key.isdigit() else f".{key}"
    else:
        text = (f".{key}" if kind == "attr" else f"[{key!r}]" if not isinstance(key, Tensor)
                else f"[<tensor of shape {list(key.shape)}>]")
    return f"{name}{text}", root, (*steps, (kind, key))


def _is_value(value) -> bool:
    # (an Enum member is compared as a value, `self.mode is Mode.SUM`, not walked into; so are
    # a range and a set of numbers or strings, `if i in self.skipped:`)
    return value is None or isinstance(value, (numbers.Number, str, np.ndarray, enum.Enum, range)
                                       ) or (isinstance(value, (set, frozenset))
                                             and len(value) <= MAX_ITEMS
                                             and all(isinstance(item, (numbers.Number, str))
                                                     for item in value))


def _walk(value, path: tuple, reached: Reached, depth: int) -> None:
    if isinstance(value, Tensor):
        reached.tensors[id(value)] = value
        reached.paths.setdefault(id(value), []).append(path)
        return
    if _is_value(value):  # (a set as it is now: the guard compares the set it finds with it)
        reached.values.append((path, set(value) if type(value) is set else value))
        return
    # (tr.nn asked only if imported: without it no Module exists, and importing it for this
    # check cost ~15 ms of a fresh process's tr.trace)
    module_api = sys.modules.get("tracer.nn.module_api")
    if (module_api is not None and isinstance(value, module_api.ModuleApi)
            and reached.hook_changes is None):
        reached.hook_changes = module_api.HOOK_CHANGES.hook_changes
    if isinstance(value, GENERATORS):  # (and walked on: a user's subclass holds attributes)
        reached.generators.setdefault(id(value), (path[0], value))
    if isinstance(value, _CODE) and path[2]:
        # (the code the function runs: `model.activation = F.gelu` traces again)
        reached.values.append((path, value))
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
        if path[2]:
            reached.values.append((_child(path, "length", None), len(value)))
        if len(value) <= MAX_ITEMS:
            for index, item in enumerate(value):
                _walk(item, _child(path, "item", index), reached, depth + 1)
    elif isinstance(value, dict):
        if path[2] and not _module_internal(path[2]) and all(
                isinstance(key, (str, int)) for key in value):
            reached.values.append((_child(path, "keys", None), tuple(value)))
        if len(value) <= MAX_ITEMS:
            for key, item in list(value.items()):
                if isinstance(key, (str, int, Tensor)):
                    _walk(item, _child(path, "item", key), reached, depth + 1)
    elif isinstance(value, types.ModuleType):  # a user's module: `import config; config.scale`
        reached.namespaces.append((path, value))
        for key, item in list(vars(value).items()):
            if not key.startswith("__"):
                _walk(item, _child(path, "attr", key), reached, depth + 1)
    elif _traced(value):  # its function
        _walk_callable(value.python_function, reached, depth, path[0])
    elif ((hasattr(value, "__dict__") or hasattr(type(value), "__slots__"))
          and (not _library_class(type(value)) or _settings(value))):
        if path[2]:  # its class, whose code runs (`model.activation = nn.Tanh()` traces again)
            reached.values.append((_child(path, "attr", "__class__"), type(value)))
        if _user_class(type(value)) or _settings(value):  # (one with __slots__ too)
            reached.namespaces.append((path, value))
            if hasattr(value, "__dict__"):
                reached.names_then[id(value)] = frozenset(vars(value))
        elif hasattr(value, "__dict__"):
            reached.own_objects.append((path, value))
        for key, item in _attributes(value):
            if not key.startswith("__"):
                _walk(item, _child(path, "attr", key), reached, depth + 1)
        _walk_class(type(value), reached, depth)


def _traced(value) -> bool:
    """Whether `value` is a traced function or method (asked of its class, not by hasattr, which
    an object whose own __getattr__ answers every name answers yes to: an addict-style config)."""
    traced_function = sys.modules.get("tracer.runtime.traced_function")
    return traced_function is not None and isinstance(
        value, (traced_function.TracedFunction, traced_function.BoundTracedFunction))


def _module_internal(steps: tuple) -> bool:
    """Whether `steps` end at a Module's own dict other than its submodules: its parameters and
    buffers (a new one is read by name, guarded as a path) and its hooks (guarded by
    HOOK_CHANGES)."""
    kind, key = steps[-1]
    return kind == "attr" and key.startswith("_") and key != "_modules"


def _attributes(value) -> list[tuple[str, Any]]:
    """An object's attributes: those in its __dict__ and in the __slots__ of its classes (a
    `dataclass(slots=True)` config has no __dict__)."""
    attributes = list(vars(value).items()) if hasattr(value, "__dict__") else []
    for name in slot_names(type(value)):
        if hasattr(value, name):  # (a slot not set yet has no value)
            attributes.append((name, getattr(value, name)))
    return attributes


def slot_names(cls: type) -> list[str]:
    """The names of the __slots__ of `cls` and its bases."""
    names = []
    for klass in cls.__mro__:
        slots = vars(klass).get("__slots__", ())
        names += [slots] if isinstance(slots, str) else slots
    return names


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
    if library_file(code.co_filename) or project_file(code.co_filename):
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


def shadowed(value) -> frozenset[str]:
    """The names that, set on the object `value` itself, would hide what its classes define -- a
    method, a class attribute -- from code that reads them through it (`block.act = f`). Not
    dunder names, which Python looks up on the class, nor data descriptors (a property, a slot),
    which an instance's attribute cannot hide; only what the user's own classes define."""
    if isinstance(value, (type, types.ModuleType)):
        return frozenset()
    return frozenset(name for klass in type(value).__mro__ if _user_class(klass)
                     for name, member in list(vars(klass).items())
                     if not name.startswith("__") and not hasattr(type(member), "__set__"))


def answers_absent(cls: type) -> bool:
    """Whether one of the user's classes among those of `cls` defines __getattr__, which answers
    for the names its objects lack (`self.temperature` read through it)."""
    return any("__getattr__" in vars(klass) and _user_class(klass) for klass in cls.__mro__)


def _user_class(cls: type) -> bool:
    module = sys.modules.get(cls.__module__)
    filename = getattr(module, "__file__", None)
    if filename is None:  # typed in, or run by runpy or exec -- or a builtin's
        return module is None or cls.__module__ == "__main__"
    return not library_file(filename) and not project_file(filename)


def _walk_class(cls: type, reached: Reached, depth: int) -> None:
    """What a user's class (an object's, or one reached by name) holds: the globals its methods
    read, and the numbers, strings and tuples in its body (`class Config: scale = 2.0`, read as
    `Config.scale` or `self.scale`), each by the path from the class itself."""
    if depth >= MAX_DEPTH:
        return
    for klass in cls.__mro__:
        if id(klass) in reached._seen or _library_class(klass):
            continue
        reached._seen.add(id(klass))
        if _user_class(klass):  # (`Model.temperature = 0.5` for `getattr(self, ...)`)
            reached.namespaces.append(((klass.__qualname__, klass, ()), klass))
        for key, member in list(vars(klass).items()):
            function = getattr(member, "__func__", getattr(member, "fget", member))
            if isinstance(function, types.FunctionType):
                _walk_callable(function, reached, depth, "self")
            elif not key.startswith("__") and (_is_value(member) or isinstance(member, tuple)):
                # floats are runtime inputs, ints, strings and tuples guarded (a class-level
                # counter the function increments then traces again on every call, as a global
                # one does: its value may be computed with); lists and dicts are state
                _walk(member, (f"{klass.__qualname__}.{key}", klass, (("attr", key),)),
                      reached, depth + 1)


