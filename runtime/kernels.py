"""The object code of a program's modules (codegen.module.GeneratedCode): its entry compiled, and
each kernel module found compiled -- in this process, or in the disk cache under a key of its own
text -- or compiled and kept in both.

A kernel module's text is all that shapes its code (its symbol is named after it), so the 4 blocks
of a transformer compile their kernels once, a program traced again for a new signature (another
batch size, `.grad` set) compiles only the kernels whose text changed, and so does a new process
whose disk cache holds an earlier program's kernels. An object made for one program is linked
into another program's engine unchanged: it refers to nothing but its own exported symbol and the
names registered with `llvm.add_symbol` (the gemm, the thread pool)."""
from __future__ import annotations

import re
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING

from tracer.codegen.symbols import LIBRARY_CALLS_MARK
from tracer.runtime import jit
from tracer.runtime.cache import ObjectCache, cache_key, open_entry, pack_objects

if TYPE_CHECKING:
    from tracer.codegen.module import GeneratedCode, KernelModule

# This process's kernel objects by symbol, most recently used last, up to MEMORY_BYTES in all (so
# that a changed shape recompiles only what changed with the disk cache off too).
MEMORY_BYTES = 64 * 2**20
_objects: OrderedDict[str, bytes] = OrderedDict()
_lock = threading.Lock()


# An index computed by integer division or remainder (codegen/render_kernel.py names index registers %iN).
_DIVIDED_INDEX = re.compile(r"\b(udiv|urem) i64 %i\d")
ENTRY_OPTIONS = {"optimized": False, "strength_reduction": True}  # a sequence of calls


def kernel_options(text: str) -> dict[str, bool]:
    """How `jit.compile_object` compiles a kernel module: as the entry if it only calls
    libraries (codegen.symbols.LIBRARY_CALLS_MARK); else optimized, and with loop strength
    reduction unless its loops index by division or remainder (see jit._code_generation)."""
    if text.startswith(LIBRARY_CALLS_MARK):
        return dict(ENTRY_OPTIONS)
    return {"optimized": True, "strength_reduction": not _DIVIDED_INDEX.search(text)}


def compile_program(code: GeneratedCode, checked: bool, cache: ObjectCache | None) -> list[bytes]:
    """The object codes of `code`, the entry's first, then each kernel module's; stored together
    in the program's `cache` entry. The modules not found compiled are compiled together
    (runtime/compile_worker.py: in a second process too when they are many)."""
    from tracer.runtime import compile_worker  # (imports subprocess: when compiling only)
    found = [found_object(kernel, checked) for kernel in code.kernels]
    missing = [kernel for kernel, object_code in zip(code.kernels, found) if object_code is None]
    compiled = compile_worker.compile_objects(
        [(code.entry, ENTRY_OPTIONS), *((k.text, kernel_options(k.text)) for k in missing)])
    made = dict(zip((kernel.symbol for kernel in missing), compiled[1:]))
    for kernel in missing:
        jit.count("kernels_compiled")
        _remember(kernel.symbol, made[kernel.symbol])
        if (kernel_cache := _kernel_cache(kernel, checked)) is not None:
            kernel_cache.store(made[kernel.symbol])
    objects = [compiled[0], *(object_code if object_code is not None else made[kernel.symbol]
                              for kernel, object_code in zip(code.kernels, found))]
    jit.count("compiled")
    if cache is not None:
        cache.store(pack_objects(objects))
        jit.LOG.debug("disk cache miss: compiled to machine code, stored as %s", cache.path)
    else:
        jit.LOG.debug("disk cache off: compiled to machine code")
    return objects


def _kernel_cache(kernel: KernelModule, checked: bool) -> ObjectCache | None:
    host = jit.host()
    return open_entry(cache_key(kernel.text, host.triple, host.cpu, host.features, checked,
                                host.llvm_version))


def found_object(kernel: KernelModule, checked: bool) -> bytes | None:
    """The object code of `kernel` compiled before, in this process or on disk; None if not."""
    with _lock:
        object_code = _objects.get(kernel.symbol)
        if object_code is not None:
            _objects.move_to_end(kernel.symbol)
    if object_code is None:
        cache = _kernel_cache(kernel, checked)
        object_code = cache.load() if cache is not None else None
        if object_code is None:
            return None
        _remember(kernel.symbol, object_code)
    jit.count("kernel_hits")
    return object_code


def _remember(symbol: str, object_code: bytes) -> None:
    with _lock:
        _objects[symbol] = object_code
        total = sum(map(len, _objects.values()))
        while total > MEMORY_BYTES and len(_objects) > 1:
            total -= len(_objects.popitem(last=False)[1])
