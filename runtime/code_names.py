"""Which names the Python code that runs while tracing reads: what decides which paths of what a
traced function can reach are guarded (runtime/reach.py, runtime/guards.py). The globals of a function are those
its code reads or writes as globals; an attribute or dict item on a path is read if some code that
ran names it so (by name, not as a method it calls; or by a string)."""
from __future__ import annotations

import contextlib
import dis
import functools
import sys
import types
from typing import Any, Callable, Iterator

from tracer.errors import project_file
from tracer.runtime import profile_hook


def may_read(steps: tuple, value: Any, used: UsedNames) -> bool:
    """Whether the code that ran may have read `value` by the names of `steps`: each in `used`,
    and the last, if `value` cannot be called, read somewhere other than as the name of a method
    called or stored to (a model's `self.step = 0`, counted up outside, beside an `opt.step()`,
    is not read)."""
    if not all(not isinstance(key, str) or key in used for _, key in steps):
        return False
    if not steps:  # (a Module's entry, `self.block`, read through its __getattr__)
        return True
    kind, key = steps[-1]
    return callable(value) or not isinstance(key, str) or used.read(key, kind)


class UsedNames(set):
    """The names and string constants of the Python code that ran while tracing (see
    `recording_names`), and that code, to tell a name read from one only called as a method."""

    def __init__(self, names: set[str], codes: set[types.CodeType]):
        super().__init__(names)
        self.codes = codes
        self._read: dict[tuple[str, str], bool] = {}

    def read(self, name: str, kind: str) -> bool:
        """Whether some code that ran may read the attribute (`kind` "attr") or the dict item
        ("item": a dict's key, a global's name) `name`: a name it loads other than as a method
        to call, whatever the kind (a __getattr__ may return `self[name]`); or a string constant.
        The code holding the string is not always the one reading by it (a helper's
        `getattr(holder, name)`, dataclasses.asdict): any user or library code's counts. tracer's
        own code reads an attribute by a string only beside its getattr and the like: its other
        strings name dict items (an optimizer's `state["step"]`)."""
        if (name, kind) not in self._read:
            self._read[name, kind] = any(
                name in _names_read(code) or (name in code.co_consts and (
                    kind != "attr" or not project_file(code.co_filename)
                    or not _BY_STRING.isdisjoint(code.co_names)))
                for code in self.codes if name in code.co_names or name in code.co_consts)
        return self._read[name, kind]

    def maybe_absent(self, library: Callable[[str], bool]) -> frozenset[str]:
        """The names of attributes the code that ran (but in files `library` names) may read
        where they are absent: by a string it holds (`getattr(model, "temperature", 1.0)`,
        `hasattr(self, "cache")`, `"cache" in vars(self)`: the identifiers among the string
        constants of code that reads attributes by strings, _BY_STRING), or by name where it
        catches AttributeError (`try: t = self.temperature` / `except AttributeError:`). (A
        superset: a name set later that is no such read traces again once.)"""
        names = set()
        for code in self.codes:
            by_string = not _BY_STRING.isdisjoint(code.co_names)
            catching = code.co_exceptiontable and _catches_attribute_errors(code)
            if not (by_string or catching) or library(code.co_filename):
                continue
            if by_string:
                # (and the names in a tuple: `for name in ("a", "b"): getattr(...)`)
                names.update(name for constant in code.co_consts for name in (
                    constant if isinstance(constant, tuple) else (constant,))
                    if isinstance(name, str) and name.isidentifier())
            if catching:
                names.update(_names_read(code, _ATTRIBUTE_LOADS))
        return frozenset(name for name in names if not name.startswith("__"))


# What reads an attribute named by a string.
_BY_STRING = frozenset({"getattr", "hasattr", "attrgetter", "__getattribute__", "__dict__",
                        "vars"})
# The instructions that name a name without reading its value: a method's load to call it
# (LOAD_METHOD in Python 3.11, LOAD_ATTR with its lowest bit set from 3.12, below) and stores.
_NOT_READS = frozenset(dis.opmap[name] for name in (
    "LOAD_METHOD", "STORE_ATTR", "DELETE_ATTR", "STORE_GLOBAL", "DELETE_GLOBAL", "STORE_NAME",
    "DELETE_NAME") if name in dis.opmap)
_NAMING = frozenset(dis.hasname) - _NOT_READS
_LOAD_ATTR = dis.opmap["LOAD_ATTR"]


_ATTRIBUTE_LOADS = frozenset({_LOAD_ATTR})
# What catches an AttributeError by name (`except AttributeError`, `except Exception`,
# `contextlib.suppress(AttributeError)`); a bare `except:` is its handler's first instruction
# popping the exception (PUSH_EXC_INFO, POP_TOP), where a `with` or `finally` does otherwise.
_CATCHING = frozenset({"AttributeError", "Exception", "BaseException"})
_PUSH_EXC_INFO, _POP_TOP = dis.opmap["PUSH_EXC_INFO"], dis.opmap["POP_TOP"]


@functools.lru_cache(maxsize=4096)
def _catches_attribute_errors(code: types.CodeType) -> bool:
    """Whether `code` (which has exception handlers) may catch an AttributeError."""
    if not _CATCHING.isdisjoint(code.co_names):
        return True
    units = code.co_code
    return any(units[index] == _PUSH_EXC_INFO and units[index + 2] == _POP_TOP
               for index in range(0, len(units) - 2, 2))


@functools.lru_cache(maxsize=4096)
def _names_read(code: types.CodeType, opcodes: frozenset[int] = _NAMING) -> frozenset[str]:
    """The names `code` reads (attributes, globals, imports; by default: those of `opcodes`):
    not a method it loads to call, nor a name it only stores. Disassembled only for code that
    names a guarded value's last step (disassembling every code a GPT step runs while tracing took
    137 ms), or catches an AttributeError."""
    return frozenset(
        instruction.argval for instruction in dis.get_instructions(code)
        if instruction.opcode in opcodes and not (
            instruction.opcode == _LOAD_ATTR and sys.version_info >= (3, 12)
            and instruction.arg & 1))


# Calls recorded by the Python profile function before the native one takes over (runtime/
# profile_hook.py): linking it takes 2-6 ms, what ~6,000 calls cost recorded in Python; the GPT
# step's trace makes ~350,000 (its recording took 150-200 ms of CPU in Python), the seed step's
# a few thousand.
NATIVE_AFTER = 6000


@contextlib.contextmanager
def recording_names() -> Iterator[UsedNames | None]:
    """A set (UsedNames) that fills, inside the block, with the names and string constants of the code
    that runs (None if another profiler is active: sys.setprofile is not ours to take)."""
    if sys.getprofile() is not None:
        yield None
        return
    codes: set = set()
    calls = 0

    def profile(frame, event, _):
        nonlocal calls
        if event == "call":
            codes.add(frame.f_code)
            calls += 1
            if calls == NATIVE_AFTER:  # a long trace: the native hook from now on, if at hand
                profile_hook.install(codes)

    used = UsedNames({"cell_contents"}, codes)
    sys.setprofile(profile)
    try:
        yield used
    finally:
        sys.setprofile(None)
        for code in codes:
            used.update(code.co_names)
            used.update(c for c in code.co_consts if isinstance(c, str))


# The instructions that name a global (LOAD_NAME and STORE_NAME: a class body, code run by exec),
# by their names' index in co_names: LOAD_GLOBAL's argument is that index shifted left by one
# (Python >= 3.11), the others' is the index.
_LOAD_GLOBAL = dis.opmap["LOAD_GLOBAL"]
_NAMING_GLOBALS = frozenset(dis.opmap[name] for name in (
    "STORE_GLOBAL", "DELETE_GLOBAL", "LOAD_NAME", "STORE_NAME", "DELETE_NAME"))
_EXTENDED_ARG = dis.opmap["EXTENDED_ARG"]


@functools.lru_cache(maxsize=4096)
def global_names(code: types.CodeType) -> frozenset[str]:
    """The global names a code object and the code nested in it read or write. Not co_names, which
    holds attributes too: a global `step = 0` that the training loop counts up, beside an
    `opt.step()` in the traced function, was guarded as if read, and each call compiled again.
    Read off the bytecode's code units as dis reads them (tests/test_trace_guards.py checks that
    they agree), ten times faster than dis.get_instructions, which took ~0.3 ms a function
    here (~0.8 ms of a fresh process's first trace of the seed step)."""
    names, units, code_names, extended = set(), code.co_code, code.co_names, 0
    for index in range(0, len(units), 2):
        opcode, argument = units[index], units[index + 1] | extended
        extended = argument << 8 if opcode == _EXTENDED_ARG else 0
        if opcode == _LOAD_GLOBAL:
            names.add(code_names[argument >> 1])
        elif opcode in _NAMING_GLOBALS:
            names.add(code_names[argument])
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            names |= global_names(constant)
    return frozenset(names)
