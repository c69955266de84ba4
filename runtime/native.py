"""The native side of the runtime, without LLVM: the host that object code is compiled for, numpy's
BLAS gemm that it calls, and object code linked into memory (runtime/loader.py), with the counters
of compiling and loading. runtime/jit.py, which compiles, imports llvmlite; a process whose
programs are all in the disk cache never imports it.

BLAS is not linked: compiled code calls `tracer_sgemm`/`tracer_dgemm`, registered by name
(`loader.add_symbol`) to the gemm of the OpenBLAS that numpy ships (no raw address ever appears in
the IR or in cached objects).
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import importlib.machinery
import logging
import os
import platform
import threading
from typing import Callable, NamedTuple, Sequence

import numpy as np

from tracer.runtime import callbacks, collectives, loader
from tracer.runtime.cache import HOST_SUFFIX, ObjectCache, open_entry

# Counters the tests read: how many programs (or modules: the thread pool) were compiled to machine
# code in this process and how many were loaded from the disk cache instead; and of the kernels
# those compiled programs are made of, how many were compiled, and how many found compiled (in
# this process or on disk) for another program or an earlier signature.
STATISTICS = {"compiled": 0, "disk_hits": 0, "kernels_compiled": 0, "kernel_hits": 0}
_lock = threading.Lock()
LOG = logging.getLogger("tracer.cache")


def count(statistic: str) -> None:
    with _lock:
        STATISTICS[statistic] += 1


class Host(NamedTuple):
    triple: str
    cpu: str
    features: str
    llvm_version: str


@functools.cache
def host() -> Host:
    """The host as LLVM sees it (part of every object's cache key). Asking LLVM means importing
    llvmlite, so the answer is remembered in the disk cache under `_host_identity`, what names
    this CPU and this LLVM without asking it."""
    identity = _host_identity()
    entry = open_entry(hashlib.sha256(identity).digest(), HOST_SUFFIX) if identity else None
    remembered = entry.load() if entry is not None else None
    if remembered is not None and remembered.count(b"\0") == len(Host._fields) - 1:
        return Host(*remembered.decode().split("\0"))
    from tracer.runtime import jit
    found = jit.llvm_host()
    if entry is not None:
        entry.store("\0".join(found).encode())
    return found


def _host_identity() -> bytes | None:
    """The first processor's entry of /proc/cpuinfo (vendor, family, model, stepping, microcode,
    flags: what LLVM's CPU name and features are made from), less its clock speed, which varies;
    with the machine and the size and modification time of llvmlite's LLVM library. None where
    either cannot be read (then LLVM is asked)."""
    # (importlib.machinery, not importlib.util: importing that took ~0.2 ms of a warm process)
    spec = importlib.machinery.PathFinder.find_spec("llvmlite")
    if spec is None or not spec.submodule_search_locations:
        return None
    binding = os.path.join(spec.submodule_search_locations[0], "binding")
    try:
        libraries = sorted(os.path.join(binding, name) for name in os.listdir(binding)
                           if "llvmlite" in name)
        with open("/proc/cpuinfo", "rb") as file:
            first = file.read(1 << 16).split(b"\n\n")[0]
        stamps = [f"{path}\0{os.stat(path).st_size}\0{os.stat(path).st_mtime_ns}"
                  for path in libraries]
    except OSError:
        return None
    if not libraries or b"flags" not in first:
        return None
    lines = [line for line in first.splitlines() if not line.startswith(b"cpu MHz")]
    return b"\n".join([b"host", platform.machine().encode(), *lines,
                       *(stamp.encode() for stamp in stamps)])


# BLAS -------------------------------------------------------------------------------------------

_GEMM_NAMES = {  # our symbol -> candidate exported names (64-bit integer interfaces first)
    "tracer_sgemm": ("scipy_cblas_sgemm64_", "cblas_sgemm64_"),
    # (a large product's: runtime/own_gemm.py registers its own gemm under this name instead)
    "tracer_large_sgemm": ("scipy_cblas_sgemm64_", "cblas_sgemm64_"),
    "tracer_dgemm": ("scipy_cblas_dgemm64_", "cblas_dgemm64_"),
}


def _blas_libraries() -> list[str]:
    directory = os.path.join(os.path.dirname(os.path.dirname(np.__file__)), "numpy.libs")
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    return sorted(os.path.join(directory, name) for name in names
                  if "openblas" in name and ".so" in name)


@functools.cache
def blas_available() -> bool:
    """Find numpy's OpenBLAS and register its 64-bit-int gemm under our names; False if absent
    (codegen then emits loop nests). TRACER_DISABLE_BLAS=1 forces the fallback."""
    if os.environ.get("TRACER_DISABLE_BLAS") == "1":
        return False
    for path in _blas_libraries():
        try:
            library = ctypes.CDLL(path)
        except OSError:
            continue
        addresses = {}
        for symbol, candidates in _GEMM_NAMES.items():
            for candidate in candidates:
                function = getattr(library, candidate, None)
                if function is not None:
                    addresses[symbol] = ctypes.cast(function, ctypes.c_void_p).value
                    break
        if len(addresses) == len(_GEMM_NAMES):
            _blas_library.append(library)  # keep it loaded
            for symbol, address in addresses.items():
                loader.add_symbol(symbol, address)
            return True
    return False


_blas_library: list = []


def blas_library() -> ctypes.CDLL | None:
    """The OpenBLAS library whose gemm compiled code calls, or None."""
    return _blas_library[0] if blas_available() and _blas_library else None


# Linking ----------------------------------------------------------------------------------------

class JitModule:
    """Object code linked into memory. The native code lives exactly as long as this object:
    releasing the last CompiledFunction that holds a JitModule unmaps the code."""

    def __init__(self, code: loader.LinkedCode | _Engine):
        self.code = code
        self._definitions: list[_MethodDefinition] = []  # of its builtins, which point into them

    @classmethod
    def link(cls, objects: Sequence[bytes], use_loader: bool = True) -> JitModule:
        """Link `objects`: each resolves the others' exported symbols and those registered with
        `loader.add_symbol`. runtime/loader.py links them where it can (`use_loader`), llvmlite's
        MCJIT elsewhere."""
        if any(collectives.needed_by(object_code) for object_code in objects):
            collectives.register()  # MPI_Allreduce and its handles, which the objects call
        if any(callbacks.needed_by(object_code) for object_code in objects):
            callbacks.register()  # the dispatcher of host callbacks
        from tracer.runtime import own_gemm  # (it imports this module)
        if any(own_gemm.needed_by(object_code) for object_code in objects):
            own_gemm.register()  # the own float32 gemm, where it replaces OpenBLAS's
        if use_loader and loader.supported():
            try:
                return cls(loader.LinkedCode(objects))
            except loader.Unsupported as reason:
                LOG.debug("linking with MCJIT: %s", reason)
        return cls(_Engine(objects))

    @classmethod
    def compile(cls, text: str, cache: ObjectCache | None) -> JitModule:
        """Compile the module `text`; its object code goes into `cache`."""
        from tracer.runtime.object_code import compile_object
        code = compile_object(text)
        count("compiled")
        if cache is not None:
            cache.store(code)
            LOG.debug("disk cache miss: compiled to machine code, stored as %s", cache.path)
        else:
            LOG.debug("disk cache off: compiled to machine code")
        return cls.link([code])

    @classmethod
    def load(cls, object_code: bytes, path: str | None = None) -> JitModule:
        """Link `object_code` (authenticated by the disk cache)."""
        module = cls.link([object_code])
        count("disk_hits")
        LOG.debug("disk cache hit: %s", path)
        return module

    def address(self, name: str) -> int:
        """The address of the function `name`; RuntimeError if there is none."""
        return self.code.address(name)

    def global_address(self, name: str) -> int:
        """The address of the global variable `name`; RuntimeError if there is none."""
        return self.code.global_address(name)

    def builtin(self, name: str, bound: object) -> Callable:
        """The METH_FASTCALL function `name` as a Python builtin whose `self` is `bound`: called
        as any builtin is, with no ctypes conversions (a ctypes call of the fast entry cost ~8,000
        instructions; callgrind). It must not outlive this module, whose code it runs."""
        definition = _MethodDefinition(name.encode(), self.address(name), _METH_FASTCALL, None)
        self._definitions.append(definition)
        return _new_builtin(ctypes.addressof(definition), bound, None)


class _MethodDefinition(ctypes.Structure):
    """CPython's PyMethodDef."""
    _fields_ = [("name", ctypes.c_char_p), ("function", ctypes.c_void_p),
                ("flags", ctypes.c_int), ("doc", ctypes.c_char_p)]


_METH_FASTCALL = 0x80
_new_builtin = ctypes.pythonapi.PyCFunction_NewEx
_new_builtin.restype = ctypes.py_object
_new_builtin.argtypes = [ctypes.c_void_p, ctypes.py_object, ctypes.py_object]
# The C API a fast entry calls (codegen/templates/fast_entry.ll.j2), resolved by name when linked.
PYTHON_API = ("PyEval_SaveThread", "PyEval_RestoreThread", "PyLong_AsVoidPtr", "Py_IncRef")


def register_python_api() -> None:
    """Make PYTHON_API resolvable for JIT code."""
    for name in PYTHON_API:
        loader.add_symbol(name, ctypes.cast(getattr(ctypes.pythonapi, name), ctypes.c_void_p).value)


class _Engine:
    """Objects linked by llvmlite's MCJIT (an engine over an empty module, the objects added)."""

    def __init__(self, objects: Sequence[bytes]):
        from tracer.runtime import object_code
        llvm = object_code.llvm
        object_code.initialize()
        for name, address in loader.registered_symbols().items():
            llvm.add_symbol(name, address)
        self.engine = llvm.create_mcjit_compiler(llvm.parse_assembly(""),
                                                 object_code.new_target_machine())
        for code in objects:
            self.engine.add_object_file(llvm.ObjectFileRef.from_data(code))
        self.engine.finalize_object()

    def address(self, name: str) -> int:
        address = self.engine.get_function_address(name)
        if not address:
            raise RuntimeError(f"JIT module has no function {name}")
        return address

    def global_address(self, name: str) -> int:
        address = self.engine.get_global_value_address(name)
        if not address:
            raise RuntimeError(f"JIT module has no global {name}")
        return address
