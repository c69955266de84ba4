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
from tracer.codegen.module import GeneratedCode, KernelModule
from tracer.runtime import jit
from tracer.runtime.cache import ObjectCache, cache_key, open_entry, pack_objects

# This process's kernel objects by symbol, most recently used last, up to MEMORY_BYTES in all (so
# that a changed shape recompiles only what changed with the disk cache off too).
MEMORY_BYTES = 64 * 2**20
_objects: OrderedDict[str, bytes] = OrderedDict()
_lock = threading.Lock()


# An index computed by integer division or remainder (codegen/render.py names index registers %iN).
_DIVIDED_INDEX = re.compile(r"\b(udiv|urem) i64 %i\d")
ENTRY_OPTIONS = {"optimized": False, "strength_reduction": True}  # a sequence of calls


def kernel_options(text: str) -> dict[str, bool]:
    """How `jit.compile_object` compiles a kernel module: optimized, and with loop strength
    reduction unless its loops index by division or remainder (see jit._code_generation)."""
    return {"optimized": True, "strength_reduction": not _DIVIDED_INDEX.search(text)}


def compile_program(code: GeneratedCode, checked: bool, cache: ObjectCache | None) -> list[bytes]:
    """The object codes of `code`, the entry's first, then each kernel module's; stored together
    in the program's `cache` entry."""
    objects = [jit.compile_object(code.entry, **ENTRY_OPTIONS),
               *(kernel_object(k, checked) for k in code.kernels)]
    jit.count("compiled")
    if cache is not None:
        cache.store(pack_objects(objects))
        jit.LOG.debug("disk cache miss: compiled to machine code, stored as %s", cache.path)
    else:
        jit.LOG.debug("disk cache off: compiled to machine code")
    return objects


def kernel_object(kernel: KernelModule, checked: bool) -> bytes:
    with _lock:
        object_code = _objects.get(kernel.symbol)
        if object_code is not None:
            _objects.move_to_end(kernel.symbol)
    if object_code is None:
        host = jit.host()
        cache = open_entry(cache_key(kernel.text, host.triple, host.cpu, host.features, checked,
                                     host.llvm_version))
        object_code = cache.load() if cache is not None else None
        if object_code is None:
            object_code = jit.compile_object(kernel.text, **kernel_options(kernel.text))
            jit.count("kernels_compiled")
            if cache is not None:
                cache.store(object_code)
            _remember(kernel.symbol, object_code)
            return object_code
        _remember(kernel.symbol, object_code)
    jit.count("kernel_hits")
    return object_code


def _remember(symbol: str, object_code: bytes) -> None:
    with _lock:
        _objects[symbol] = object_code
        total = sum(map(len, _objects.values()))
        while total > MEMORY_BYTES and len(_objects) > 1:
            total -= len(_objects.popitem(last=False)[1])
