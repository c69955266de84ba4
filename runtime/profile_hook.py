"""A native profile function that records the code objects of the Python functions called while
a function is traced (runtime/code_names.py), so that the guards know which names the code that
ran reads; compiled from codegen/templates/profile_hook.ll.j2 and kept in the disk cache, as the
thread pool is. Recorded by a Python profile function, the calls of the GPT step's trace took
360 ms of CPU instead of 150-210 ms without recording (every call, return and builtin call ran
a Python function).

`install(codes)` sets it for the calling thread: linked from the disk cache (without LLVM), or
compiled first (~10 ms, and LLVM's import, which a cold process's compile needs anyway);
code_names.py records the first calls of every trace in Python and installs it from its Python
profile function once a trace is long, where linking it pays; if it cannot be had, the recording
stays in Python. `sys.setprofile(None)` removes it."""
from __future__ import annotations

import ctypes
import logging
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


def _address() -> int | None:
    with _lock:
        if _unavailable or platform.python_implementation() != "CPython":
            return None
        if not _hook:
            module = _linked()
            _hook.append((module, module.address(SYMBOL)))
        return _hook[0][1]


def _linked() -> native.JitModule:
    """The hook linked into this process, from the disk cache or compiled now (not counted among
    the programs compiled or loaded: it is the runtime's)."""
    for name in _C_API:
        loader.add_symbol(name, ctypes.cast(getattr(ctypes.pythonapi, name), ctypes.c_void_p).value)
    cache = _cache()
    code = cache.load() if cache is not None else None
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
