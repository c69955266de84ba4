"""The object code of a program's modules (codegen.module.GeneratedCode): its entry compiled, and
each kernel module found compiled -- in this process, or in the disk cache under a key of its own
text -- or compiled (from the moment it is rendered) and kept in both.

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

from tracer.codegen.symbols import LIBRARY_CALLS_MARK, QUICK_MARK
from tracer.runtime import jit, own_gemm, pool
from tracer.runtime.cache import ObjectCache, cache_key, open_entry, pack_objects

if TYPE_CHECKING:
    from tracer.codegen.module import GeneratedCode, KernelModule
    from tracer.runtime.compile_worker import Worker

# This process's kernel objects by symbol, most recently used last, up to MEMORY_BYTES in all (so
# that a changed shape recompiles only what changed with the disk cache off too).
MEMORY_BYTES = 64 * 2**20
_objects: OrderedDict[str, bytes] = OrderedDict()
_lock = threading.Lock()


# An index computed by integer division or remainder (codegen/render_kernel.py names index registers %iN).
_DIVIDED_INDEX = re.compile(r"\b(udiv|urem) i64 %i\d")
ENTRY_OPTIONS = {"optimized": False, "strength_reduction": True}  # a sequence of calls


def kernel_options(text: str) -> dict[str, bool]:
    """How `object_code.compile_object` compiles a kernel module: as the entry if it only calls
    libraries (codegen.symbols.LIBRARY_CALLS_MARK); else optimized -- quickly if its work does not
    matter (QUICK_MARK) -- and with loop strength reduction unless its loops index by division or
    remainder (see object_code._code_generation)."""
    if text.startswith(LIBRARY_CALLS_MARK):
        return dict(ENTRY_OPTIONS)
    return {"optimized": True, "strength_reduction": not _DIVIDED_INDEX.search(text),
            "quick": text.startswith(QUICK_MARK)}


class ProgramCompilation:
    """The object codes of one program's modules, the entry's first, then each kernel module's;
    stored together in the program's cache entry. Each kernel module is added as soon as it is
    rendered (`add`): found compiled, or compiled from then on (runtime/compile_worker.py: by
    `worker` if there is one, while the rest are rendered); `finish` adds the entry, compiles
    what is left and returns them. The thread pool's module, if the entry calls it (its kernels
    split across threads) and this process has none yet, is compiled with them (pool.compile_job)
    -- or by the worker before them, if it was started so (Worker.compile_pool_first) -- and
    started before they are loaded; so is the own gemm's (runtime/own_gemm.py), if a kernel calls
    it and this process has none yet. Used as a context manager: leaving it by an exception stops
    the compilation."""

    def __init__(self, checked: bool, worker: Worker | None = None):
        from tracer.runtime import compile_worker  # (imports subprocess: when compiling only)
        self.checked = checked
        self.compilation = compile_worker.Compilation(worker)
        self.found: dict[str, bytes] = {}  # by symbol
        self.jobs: dict[str, int] = {}  # the compilation's job of each kernel not found, by symbol
        # whether the worker compiles the pool apart from the jobs (Worker.compile_pool_first)
        self.pool_in_worker = worker is not None and worker.pool_sent

    def __enter__(self) -> ProgramCompilation:
        return self

    def __exit__(self, kind, error, traceback) -> None:
        self.compilation.close()

    def add(self, kernel: KernelModule) -> None:
        if kernel.symbol in self.found or kernel.symbol in self.jobs:
            return
        compiled = found_object(kernel, self.checked)
        if compiled is not None:
            self.found[kernel.symbol] = compiled
        else:
            self.jobs[kernel.symbol] = len(self.jobs)
            self.compilation.add((kernel.text, kernel_options(kernel.text)))

    def finish(self, code: GeneratedCode, cache: ObjectCache | None) -> list[bytes]:
        for kernel in code.kernels:
            self.add(kernel)
        threaded = pool.needed_by(code.entry)
        text = pool.compile_job() if threaded and not self.pool_in_worker else None
        if text is not None:
            self.jobs[pool.SYMBOL] = len(self.jobs)
            self.compilation.add((text, pool.COMPILE_OPTIONS))
        calls = any(own_gemm.called_in(kernel.text) for kernel in code.kernels)
        gemm = own_gemm.compile_job() if calls else None
        if gemm is not None:
            self.jobs[own_gemm.SYMBOL] = len(self.jobs)
            self.compilation.add((gemm, own_gemm.COMPILE_OPTIONS))
        self.compilation.add((code.entry, ENTRY_OPTIONS))
        compiled = self.compilation.finish()
        if text is not None:
            pool.start(compiled[self.jobs[pool.SYMBOL]])
        if gemm is not None:
            own_gemm.register(compiled[self.jobs[own_gemm.SYMBOL]])
        elif threaded and self.pool_in_worker:
            pool.start(self.compilation.worker.take_pool())  # (None: compiled here)
        for kernel in code.kernels:
            if kernel.symbol in self.jobs:
                made = compiled[self.jobs[kernel.symbol]]
                jit.count("kernels_compiled")
                _remember(kernel.symbol, made)
                if (kernel_cache := _kernel_cache(kernel, self.checked)) is not None:
                    kernel_cache.store(made)
        objects = [compiled[-1], *(self.found[kernel.symbol] if kernel.symbol in self.found
                                   else compiled[self.jobs[kernel.symbol]]
                                   for kernel in code.kernels)]
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
        compiled = _objects.get(kernel.symbol)
        if compiled is not None:
            _objects.move_to_end(kernel.symbol)
    if compiled is None:
        cache = _kernel_cache(kernel, checked)
        compiled = cache.load() if cache is not None else None
        if compiled is None:
            return None
        _remember(kernel.symbol, compiled)
    jit.count("kernel_hits")
    return compiled


def forget() -> None:
    """Forget the kernel objects this process compiled or loaded (the benchmarks time a fresh
    compile so)."""
    with _lock:
        _objects.clear()


def _remember(symbol: str, compiled: bytes) -> None:
    with _lock:
        _objects[symbol] = compiled
        total = sum(map(len, _objects.values()))
        while total > MEMORY_BYTES and len(_objects) > 1:
            total -= len(_objects.popitem(last=False)[1])
