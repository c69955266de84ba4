"""A native profile function that records the code objects of the Python functions called while
a function is traced (runtime/code_names.py), so that the guards know which names the code that
ran reads; compiled from codegen/templates/profile_hook.ll.j2 and kept in the disk cache, as the
thread pool is. Recorded by a Python profile function, the calls of the GPT step's trace took
360 ms of CPU instead of 150-210 ms without recording (every call, return and builtin call ran
a Python function).

`install(codes)` sets it for the calling thread: linked from the disk cache (without LLVM), or
compiled first (~10 ms, and LLVM's import, which a cold process's compile needs anyway).
code_names.py installs it when a trace starts if it is `at_hand` (linked, or in the disk cache:
recorded in Python, the seed step's trace took ~15 M instructions more than the hook's linking,
a quarter of a warm process's first call), else from its Python profile function once a trace is
long, where compiling it pays; if it cannot be had, the recording stays in Python. A program
compiled (with LLVM imported) compiles it `ahead` into the disk cache, so that the processes
after find it at hand. `sys.setprofile(None)` removes it."""
from __future__ import annotations

import ctypes
import logging
import os
import platform
import sys
import threading

from tracer.runtime import loader, native
from tracer.runtime.cache import HOOK_SUFFIX, ObjectCache, cache_key, open_entry

SYMBOL = "tracer_profile"
# The C API the hook calls (Python >= 3.9: PyFrame_GetCode), resolved by name when it is linked.
_C_API = ("PyFrame_GetCode", "PySet_Add", "Py_DecRef", "PyErr_Clear")
_lock = threading.Lock()
_hook: list[tuple[native.JitModule, int]] = []  # (the linked module, kept; the hook's address)
_unavailable: list[Exception] = []  # why linking or compiling it failed, if it did (not retried)
LOG = logging.getLogger("tracer.cache")


def install(codes: set) -> bool:
    """Make the hook the calling thread's profile function, adding to `codes`; whether it could be
    had (if not, nothing was done). Never raises: it runs inside a Python profile function,
    where an exception would end the recording and surface in the traced code."""
    try:
        address = _address()
    except Exception as error:  # noqa: BLE001 - recording in Python is always possible
        _unavailable.append(error)
        LOG.debug("the native profile hook is not available: %r", error)
        return False
    if address is None:
        return False
    _set_profile(address, codes)
    return True


_set_profile = ctypes.pythonapi.PyEval_SetProfile
_set_profile.restype, _set_profile.argtypes = None, [ctypes.c_void_p, ctypes.py_object]


def at_hand() -> bool:
    """Whether the hook can be had without compiling it: linked already, or (then linked now)
    in the disk cache. Never raises."""
    try:
        return _address(compile_it=False) is not None
    except Exception as error:  # noqa: BLE001 - as in `install`
        _unavailable.append(error)
        return False


def ahead() -> None:
    """Compile the hook into the disk cache if it is not there (a process that has compiled a
    program: LLVM is imported), for the processes after (see `at_hand`). Never raises."""
    try:
        cache = _cache()
        if cache is not None and not _hook and not os.path.exists(cache.path):
            _address()
    except Exception as error:  # noqa: BLE001 - as in `install`
        _unavailable.append(error)


def _address(compile_it: bool = True) -> int | None:
    """The hook's address, linked now if need be (compiled first, if `compile_it` and the disk
    cache lacks it); None where it cannot be had."""
    with _lock:
        if _unavailable or platform.python_implementation() != "CPython":
            return None
        if not _hook:
            module = _linked(compile_it)
            if module is None:
                return None
            _hook.append((module, module.address(SYMBOL)))
        return _hook[0][1]


def _linked(compile_it: bool = True) -> native.JitModule | None:
    """The hook linked into this process, from the disk cache or compiled now (not counted among
    the programs compiled or loaded: it is the runtime's); None if it is not in the disk cache
    and not `compile_it`."""
    cache = _cache()
    code = cache.load() if cache is not None else None
    if code is None and not compile_it:
        return None
    for name in _C_API:
        loader.add_symbol(name, ctypes.cast(getattr(ctypes.pythonapi, name), ctypes.c_void_p).value)
    if code is None:
        from tracer.codegen.template_environment import render
        from tracer.runtime import object_code, template_cache
        template_cache.install()
        code = object_code.compile_object(render("profile_hook.ll.j2",
                                                 triple=native.host().triple))
        if cache is not None:
            cache.store(code)
    return native.JitModule.link([code])


def _cache() -> ObjectCache | None:
    host = native.host()
    # the compiler's fingerprint in the key covers the template: no text is needed for a hit
    return open_entry(cache_key(f"profile hook, Python {sys.version_info[:2]}", host.triple,
                                host.cpu, host.features, False, host.llvm_version), HOOK_SUFFIX)
