"""The one thread pool of this process, which runs the kernels split across threads.

The pool is native code (codegen/templates/pool.ll.j2), compiled once per process, on the first
compile or load of code that calls it (or loaded from the disk cache), and registered with LLVM by
name: generated code calls `tracer_parallel` and never holds an address, so cached objects stay
valid in every process. Its workers start on the first parallel launch and are kept: a launch wakes
them (a futex) instead of creating threads. In the child of a `fork` the pool starts afresh; at
exit the workers are joined, so that none runs the pool's code when its memory is released.

Why this and not libgomp's GOMP_parallel (also a persistent pool, shipped with gcc), measured on
the shared 2-core machine with a 2-chunk elementwise kernel called through ctypes, each way in a
process of its own: a launch with nothing to do costs ~0.3 us here, ~1 us with libgomp and ~16 us
creating and joining a pthread. On 256K floats libgomp's median call was faster (35 us against
~65 us for both one thread and this pool), but its mean was 1.4-2.1 ms against ~0.3 ms: each
thread of a libgomp team must run its own share, so a call waits whenever the machine has
descheduled a worker, while here the caller takes whatever chunks no worker has taken. libgomp's
workers also spin for 300,000 pauses after each region unless its environment variables (shared
with PyTorch's copy of it) say otherwise. A C file built by the Makefile would add a build step
and a compiler at install time; this needs only llvmlite (to compile it once).
"""
from __future__ import annotations

import atexit
import ctypes
import functools
import logging
import os
import platform
import threading
from typing import Callable

from tracer.runtime import loader, native
from tracer.runtime.cache import ObjectCache, cache_key, open_entry

SYMBOL = "tracer_parallel"
# The futex system call's number and the spin-wait hint of each architecture the pool supports.
_ARCHITECTURES = {"x86_64": (202, "x86"), "aarch64": (98, "aarch64")}
SUPPORTED = platform.machine() in _ARCHITECTURES  # elsewhere every kernel runs on one thread
MAX_WORKERS = 255
# How long a worker spins (nanoseconds, on the clock: a pause takes 10 ns on one x86 CPU and 50 on
# another) before sleeping: kernels launched back to back find it awake, and so does the next
# call of a step whose caller spent less than this in Python between calls, and an idle pool soon
# stops taking a core from the rest of the machine. A sleeping worker wakes tens of microseconds
# after the futex: with 20 us of spinning (2,000 pauses of the Sapphire Rapids host), the seed step
# (benchmarks/threads.py) took 0.32 ms on two threads against 0.29 on one; with 200 us, 0.25 ms.
# (OpenMP's default spins ~300,000 pauses: milliseconds.) The clock is read every CLOCK_EVERY
# pauses.
SPIN_NANOSECONDS, CLOCK_EVERY = 200_000, 16
# After a launch that waited for a descheduled worker (see pool.ll.j2): how many launches run on
# the caller alone, doubling after each further stall in a row up to BACKOFF_MAX; a wait counts as
# a stall past twice the caller's mean chunk plus STALL_SLACK nanoseconds (a worker's wake-up).
BACKOFF, BACKOFF_MAX, STALL_SLACK = 16, 1024, 20000
LOG = logging.getLogger("tracer.cache")
COMPILE_OPTIONS = {"optimized": True, "strength_reduction": True}  # of object_code.compile_object

_lock = threading.Lock()
_pool: list[native.JitModule] = []  # the compiled pool, once there is one (kept to the end)


def needed_by(code: str | bytes) -> bool:
    """Whether LLVM text or object code calls the pool: its name is in the text, or in the object's
    symbol table (a false positive only compiles the pool for nothing)."""
    return (SYMBOL if isinstance(code, str) else SYMBOL.encode()) in code


def start(compiled: bytes | None = None) -> None:
    """Make `tracer_parallel` resolvable for JIT code: compile (or load) the pool on first use;
    `compiled` is its object code if a program's compilation made it (see `compile_job`)."""
    with _lock:
        if _pool:
            return
        if compiled is not None:
            native.count("compiled")
            cache = _cache()
            if cache is not None:
                cache.store(compiled)
            module = native.JitModule.link([compiled])
        else:
            module = _compile()
        loader.add_symbol(SYMBOL, module.address(SYMBOL))
        forget = ctypes.CFUNCTYPE(None)(module.address("tracer_pool_forget"))
        stop = ctypes.CFUNCTYPE(None)(module.address("tracer_pool_stop"))
        os.register_at_fork(after_in_child=forget)
        atexit.register(stop)
        _pool.append(module)


COUNTS = ("shared", "backed_off", "owned", "stalls")


def counts() -> dict[str, int]:
    """This process's launches of several chunks so far, by how they ran: `shared` with the
    workers, on the caller alone because of a stall's back-off (`backed_off`) or because another
    thread's launch owned the pool (`owned`); and the `stalls` that started back-offs. All 0
    before the pool starts. How much of a step the machine let run on two threads
    (benchmarks/thread_scaling.py)."""
    if not _pool:
        return dict.fromkeys(COUNTS, 0)
    values = (ctypes.c_int64 * len(COUNTS))()
    ctypes.CFUNCTYPE(None, ctypes.c_void_p)(_pool[0].address("tracer_pool_counts"))(
        ctypes.addressof(values))
    return dict(zip(COUNTS, values))


def compile_job() -> str | None:
    """The pool's LLVM text, for the compilation of a program that calls it to compile with its
    kernels (runtime/kernels.py; in the compile worker, while this process renders them), if
    this process has no pool yet and the disk cache holds none: compiled when the program is
    loaded, after its kernels, it took ~100 ms of a cold compile's wall-clock time."""
    if _pool:
        return None
    cache = _cache()
    if cache is not None and cache.load() is not None:
        return None
    return _text()


def _cache() -> ObjectCache | None:
    architecture = platform.machine()
    host = native.host()
    settings = (f"thread pool (chunks, threads), {architecture}, spin={SPIN_NANOSECONDS} ns "
                f"every {CLOCK_EVERY}, "
                f"max_workers={MAX_WORKERS}, backoff={BACKOFF}-{BACKOFF_MAX}, "
                f"slack={STALL_SLACK}")
    # the compiler's fingerprint in the key covers the template: no text is needed for a hit
    return open_entry(cache_key(settings, host.triple, host.cpu, host.features, False,
                                host.llvm_version))


def _text() -> str:
    from tracer.codegen.template_environment import render
    from tracer.runtime import template_cache
    template_cache.install()
    futex, pause = _ARCHITECTURES[platform.machine()]
    return render("pool.ll.j2", triple=native.host().triple, futex=futex, pause=pause,
                  spin=SPIN_NANOSECONDS, clock_every=CLOCK_EVERY, max_workers=MAX_WORKERS,
                  backoff=BACKOFF, backoff_max=BACKOFF_MAX, stall_slack=STALL_SLACK)


def _compile() -> native.JitModule:
    cache = _cache()
    cached = cache.load() if cache is not None else None
    if cached is not None:
        try:
            return native.JitModule.load(cached, cache.path)
        except RuntimeError as error:
            LOG.warning("could not load the thread pool from %s (%s); compiling it again",
                        cache.path, error)
    return native.JitModule.compile(_text(), cache)


# One thread policy: while compiled code runs, numpy's OpenBLAS runs each gemm on its caller's
# thread, since this pool splits the large ones into blocks (ir/schedule_threads.py) and
# runs a batch of small ones across its threads. Left threaded, OpenBLAS's own threads (which
# spin for a while after each call) competed with the pool's for the cores: a GPT step took 9 s
# instead of 1 s on the loaded 2-core machine (its attention's 96-matrix batches each ran as 96
# two-thread gemms). Its setting is the process's, so it is restored when the last concurrent
# call returns, for numpy's own products.
_blas_lock = threading.Lock()
_blas_callers = 0
_blas_saved = 0


@functools.cache
def _blas_thread_functions() -> tuple[Callable, Callable] | None:
    """OpenBLAS's (get, set) of its thread count, or None without it."""
    library = native.blas_library()
    names = ("scipy_openblas_get_num_threads64_", "scipy_openblas_set_num_threads64_")
    functions = [getattr(library, name, None) for name in names] if library else [None]
    if None in functions:
        return None
    get, set_ = functions
    get.restype, get.argtypes = ctypes.c_int, []
    set_.restype, set_.argtypes = None, [ctypes.c_int]
    return get, set_


def hold_blas(needed: bool = True) -> None:
    """Run OpenBLAS on the calling thread until the matching release_blas() (if `needed`)."""
    global _blas_callers, _blas_saved
    functions = _blas_thread_functions() if needed else None
    if functions is None:
        return
    with _blas_lock:
        _blas_callers += 1
        if _blas_callers == 1:
            _blas_saved = functions[0]()
            if _blas_saved != 1:
                functions[1](1)


def release_blas(needed: bool = True) -> None:
    global _blas_callers
    functions = _blas_thread_functions() if needed else None
    if functions is None:
        return
    with _blas_lock:
        _blas_callers -= 1
        if _blas_callers == 0 and _blas_saved != 1:
            functions[1](_blas_saved)
