"""Which names the Python code that runs while tracing reads: what decides which paths of what a
traced function can reach are guarded (runtime/reach.py, runtime/guards.py). The globals of a function are those
its code reads or writes as globals; an attribute or dict item on a path is read if some code that
ran names it so (by name, not as a method it calls; or by a string)."""
from __future__ import annotations

import contextlib
import dis
import functools
import gc
import sys
import threading
import types
from typing import AbstractSet, Any, Callable, Iterator

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
        self._user_codes: list[types.CodeType] | None = None

    def assuming(self, names: AbstractSet[str]) -> UsedNames:
        """These names and `names`, all counted as read (the attributes of the user's objects,
        where the code builds the names it reads)."""
        assumed = UsedNames(self | names, self.codes)
        assumed._read = {(name, kind): True for name in names for kind in ("attr", "item")}
        assumed._user_codes = self._user_codes
        return assumed

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

    def user_codes(self, library: Callable[[str], bool]) -> list[types.CodeType]:
        """The code that ran but that in files `library` names (each file asked once; the
        answer kept: `library` is the same on every call)."""
        if self._user_codes is None:
            verdicts = {filename: library(filename)
                        for filename in {code.co_filename for code in self.codes}}
            self._user_codes = [code for code in self.codes if not verdicts[code.co_filename]]
        return self._user_codes

    def maybe_absent(self, library: Callable[[str], bool]) -> frozenset[str]:
        """The names of attributes the user's code that ran (see `user_codes`) may read where
        they are absent: by a string it holds (`getattr(model, "temperature", 1.0)`,
        `hasattr(self, "cache")`, `"cache" in vars(self)`: the identifiers among the string
        constants of code that reads attributes by strings, _BY_STRING), or by name where it
        catches AttributeError (`try: t = self.temperature` / `except AttributeError:`). (A
        superset: a name set later that is no such read traces again once.)"""
        names = set()
        for code in self.user_codes(library):
            if not _BY_STRING.isdisjoint(code.co_names):
                names |= _string_names(code)
            if code.co_exceptiontable and _catches_attribute_errors(code):
                names |= _names_read(code, _ATTRIBUTE_LOADS)
        return frozenset(name for name in names if not name.startswith("__"))

    def attributes_loaded(self, library: Callable[[str], bool]) -> frozenset[str]:
        """The attributes the user's code that ran loads by name."""
        return frozenset().union(*(_names_read(code, _ATTRIBUTE_LOADS)
                                   for code in self.user_codes(library)))

    def read_through_dicts(self, library: Callable[[str], bool]) -> frozenset[str]:
        """The names of attributes the user's code that ran may read from an object's own dict
        by a string it holds (`vars(layer).get("scale", 1.0)`, `layer.__dict__.get(...)`):
        reads that pass no __getattr__, which notes those of getattr and hasattr on tracer's
        objects (tracer.context.AbsentNamesNoted)."""
        return frozenset(name for code in self.user_codes(library)
                         if not _DICT_READERS.isdisjoint(code.co_names)
                         for name in _string_names(code))

    def building_names(self, library: Callable[[str], bool]) -> frozenset[types.CodeType]:
        """The user's code that ran and reads attributes of its `self` by names it builds,
        which the recorded strings do not hold (`getattr(self, f"act{i}")`, `getattr(self,
        "scale_" + kind, 1.0)`, `getattr(self, name)`: see _builds_names)."""
        return frozenset(code for code in self.user_codes(library)
                         if not _NAMED_READERS.isdisjoint(code.co_names) and _builds_names(code))


def attributes_read(function: Any) -> frozenset[str]:
    """The attributes the code of `function` loads by name (not the methods it calls)."""
    code = getattr(function, "__code__", None)
    return _names_read(code, _ATTRIBUTE_LOADS) if code is not None else frozenset()


# What reads an attribute named by a string; of those, what reads an object's own dict.
_BY_STRING = frozenset({"getattr", "hasattr", "attrgetter", "__getattribute__", "__dict__",
                        "vars"})
_DICT_READERS = frozenset({"__dict__", "vars"})


@functools.lru_cache(maxsize=4096)
def _string_names(code: types.CodeType) -> frozenset[str]:
    """The identifiers among the string constants of `code` (and in its tuples: `for name in
    ("a", "b"): getattr(...)`), but dunder names."""
    return frozenset(name for constant in code.co_consts
                     for name in (constant if isinstance(constant, tuple) else (constant,))
                     if isinstance(name, str) and name.isidentifier()
                     and not name.startswith("__"))
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


# What reads an attribute by a name given as an argument, and the instructions that call.
_NAMED_READERS = frozenset({"getattr", "hasattr"})
_CALLS = frozenset({"PRECALL", "CALL"})  # (3.11 calls with PRECALL first, 3.12 without)


@functools.lru_cache(maxsize=4096)
def _builds_names(code: types.CodeType) -> bool:
    """Whether `code`, a method, calls getattr or hasattr on its `self` with a name other than a
    string constant. Read off the stack depths after the reader is loaded: its call is the first
    call whose argument count is the depth then; the object is what runs until the last depth 1
    before it (`self` if that is one LOAD_FAST of the first argument), the name what runs from
    there to the last depth 2, a constant if that is one LOAD_CONST of a string. (Where an
    argument jumps, `a if c else b`, the depths overcount: not a constant, the safe side. Names
    built for other objects, `getattr(F, name)` or `getattr(tensor, op)`, are not counted: each
    would count every attribute of the user's objects as read, guarded on every call.)"""
    if not code.co_argcount:
        return False
    instructions = list(dis.get_instructions(code))
    for start, reader in enumerate(instructions):
        if reader.opcode not in _LOADS_BY_NAME or reader.argval not in _NAMED_READERS:
            continue
        depth, last = 0, {}
        for position in range(start + 1, len(instructions)):
            instruction = instructions[position]
            if instruction.opname in _CALLS and instruction.arg == depth:
                target = instructions[start + 1:last.get(1, start) + 1]
                name = instructions[last.get(1, position) + 1:last.get(2, start) + 1]
                if depth >= 2 and [(i.opname, i.argval) for i in target] == [
                        ("LOAD_FAST", code.co_varnames[0])] and not (
                        len(name) == 1 and name[0].opname == "LOAD_CONST"
                        and isinstance(name[0].argval, str)):
                    return True
                break
            depth += dis.stack_effect(instruction.opcode, instruction.arg
                                      if instruction.opcode >= dis.HAVE_ARGUMENT else None)
            last[depth] = position
    return False


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
# profile_hook.py), where it was not at hand when the trace started: compiling it takes ~10 ms,
# what ~6,000 calls cost recorded in Python; the GPT step's trace makes ~350,000 (its recording
# took 150-200 ms of CPU in Python), the seed step's a few thousand.
NATIVE_AFTER = 6000


@contextlib.contextmanager
def recording_names() -> Iterator[UsedNames | None]:
    """A set (UsedNames) that fills, inside the block, with the names and string constants of the code
    that runs (None if another profiler is active: sys.setprofile is not ours to take). Not the
    code a garbage collection runs meanwhile: the finalizers and weakref callbacks of garbage made
    anywhere before, which run wherever a collection happens to start; recorded, the names they
    read were guarded or not by chance (and two recordings of the same code differed)."""
    if sys.getprofile() is not None:
        yield None
        return
    # (asked before the collector's callbacks below exist: linking may import and collect)
    hook_at_hand = profile_hook.at_hand()  # linked already, or in the disk cache
    codes: set = set()
    calls = 0
    native = False  # whether the native hook records (see `profile`)
    thread = threading.get_ident()

    def profile(frame, event, _):
        nonlocal calls, native
        if event == "call":
            codes.add(frame.f_code)
            calls += 1
            if calls == NATIVE_AFTER:  # a long trace: the native hook from now on, if at hand
                native = profile_hook.install(codes)

    # Off from the first callback of a collection to the last (others' callbacks run in between);
    # one on another thread runs none of this thread's code.
    def pausing(phase, _):
        if phase == "start" and threading.get_ident() == thread:
            sys.setprofile(None)

    def resuming(phase, _):
        if phase == "stop" and threading.get_ident() == thread:
            if native:
                profile_hook.install(codes)  # (linked already: it cannot fail now)
            else:
                sys.setprofile(profile)

    used = UsedNames({"cell_contents"}, codes)
    gc.callbacks.insert(0, pausing)
    gc.callbacks.append(resuming)
    native = hook_at_hand and profile_hook.install(codes)
    if not native:
        sys.setprofile(profile)
    try:
        yield used
    finally:
        gc.callbacks.remove(pausing)  # (first: a collection now must not resume the recording)
        gc.callbacks.remove(resuming)
        sys.setprofile(None)
        codes.discard(pausing.__code__)  # (its call was recorded: it starts each collection)
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
_LOADS_BY_NAME = frozenset({_LOAD_GLOBAL, dis.opmap["LOAD_NAME"]})


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
