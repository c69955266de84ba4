"""A compiled Function: fused kernels in LLVM modules (runtime/kernels.py), one native entry point.

    compiled = compile_function(ir.optimize(function))
    outputs = compiled([x, w])          # numpy arrays in, fresh numpy arrays out

Everything that does not depend on the argument values is done once, at construction: fusion,
memory planning, the disk-cache key (from the program and the settings), then either loading the
object code of a hit, or scheduling, code generation and compilation (runtime/pipeline.py); the
output shapes and dtypes and the layout of the pointer array. The loop IR and the LLVM text of a
hit are made only if asked for (`loops`, `llvm_ir`, `stage_text`, a bounds failure's message). A
call converts the arguments to C-contiguous arrays of the parameter dtypes (a no-op when they
already are), allocates the outputs, fills the pointer array and makes one ctypes call, which
releases the GIL.

With TRACER_CHECK_BOUNDS=1 (read at compile time) the code is bounds-checked (codegen/bounds.py):
a call whose native code caught an access outside a buffer raises `tr.BoundsError`. The indices of
gather and scatter are checked always: one out of range raises `tr.IndexOutOfRangeError`, and the
arguments are unchanged (see `CompiledFunction._copies_targets`).
"""
from __future__ import annotations

import ctypes
import logging
import threading
import time
import weakref
from typing import Callable, NamedTuple, Sequence

import numpy as np

from tracer.codegen.bounds import RECORD_BYTES, Sites
from tracer.ir.fusion import FusedFunction
from tracer.ir.fusion_text import format_fused
from tracer.ir.graph import Function
from tracer.ir.loops import LoopKernel, LoopProgram, format_program
from tracer.ir.memory import ALIGNMENT, MemoryPlan
from tracer.ir.text import format_function
from tracer.runtime import callbacks, jit, pool
from tracer.runtime.cache import ObjectCache, cache_directory, cache_key, open_entry, unpack_objects
from tracer.runtime.kernels import compile_program, stage_text
from tracer.runtime.pipeline import BACK_END_STAGES, BackEnd
from tracer.runtime.code_settings import CodeSettings
from tracer.errors import BoundsError, IndexOutOfRangeError
from tracer.ir.index_checks import can_fail

_ENTRY = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
LOG = logging.getLogger("tracer.cache")


class KernelTime(NamedTuple):
    """What TRACER_PROFILE=1 measured for one kernel, over every call since compilation."""
    kernel: str
    calls: int
    seconds: float


class CompiledFunction:
    """`write_into={output index: parameter index}` asks for outputs to be written directly into
    the buffers of parameters (an in-place update); `in_place` holds the pairs the memory planner
    found safe. For those, a call writes into the argument array itself when it can -- an ndarray
    of exactly the parameter's dtype, C-contiguous, writeable and sharing no memory with another
    argument -- and returns that same array object as the output; otherwise it runs on a private
    copy of the argument and returns the copy, which the caller copies back. So the caller writes
    back with `if output is not target: np.copyto(target, output)`."""

    stages: tuple[str, ...] = BACK_END_STAGES  # the stages `stage_text` prints

    def __init__(self, function: Function, write_into: dict[int, int] | None = None,
                 settings: CodeSettings | None = None):
        self.function = function
        self.settings = settings = settings or CodeSettings.current()
        self.profiling = settings.profile
        host = jit.host()
        self.back_end = BackEnd(function, write_into, blas=settings.blas,
                                threads=settings.threads, triple=host.triple,
                                layout=settings.layout, profile=settings.profile,
                                checked=settings.checked)
        self.timings: dict[str, float] = self.back_end.timings  # seconds per back-end step
        self.fused: FusedFunction = self.back_end.fused
        self.plan: MemoryPlan = self.back_end.plan
        self.in_place: dict[int, int] = dict(self.plan.in_place)
        # The disk key comes from the program and the settings, so a hit needs neither the loop
        # IR nor the LLVM text. The user's lines do not change the object code (the table of
        # bounds-checked accesses that names them is made from `function` when needed): an edit
        # that moves the code still hits.
        program = "\n".join([format_function(function, locations=False),
                             f"write_into={sorted((write_into or {}).items())}", repr(settings)])
        self.disk_key = cache_key(program, host.triple, host.cpu, host.features, settings.checked,
                                  host.llvm_version)
        cache = open_entry(self.disk_key)
        started = time.perf_counter()
        cached = cache.load() if cache is not None else None
        objects = unpack_objects(cached) if cached is not None else None
        self.from_disk_cache = objects is not None and self._load(objects, cache)
        if not self.from_disk_cache:
            code = self.back_end.code  # scheduled and rendered on a miss only (timed there)
            started = time.perf_counter()
            self._link(compile_program(code, settings.checked, cache))
        self.timings["llvm"] = time.perf_counter() - started  # compiling, or loading a hit
        # the steps of compiling (a hit's loop IR and LLVM text, made later if asked for, are not)
        self.compile_steps = tuple(self.timings)
        self._stages: dict[str, str] = {}

        self._parameters = [(p.shape, p.dtype) for p in function.parameters]
        self._outputs = [(v.shape, v.dtype) for v in self.plan.output_slots]
        slot_of = {id(v): i for i, v in enumerate(self.plan.output_slots)}
        seen: set[int] = set()
        # (output slot, whether this position must copy an earlier one); in-place outputs are
        # (-1 - parameter index, False)
        self._returns = []
        for position, value in enumerate(function.outputs):
            if position in self.in_place:
                self._returns.append((-1 - self.in_place[position], False))
                continue
            self._returns.append((slot_of[id(value)], id(value) in seen))
            seen.add(id(value))
        # the common case: each result is its own output slot, in order
        self._returns_outputs = self._returns == [(i, False) for i in range(len(self._outputs))]
        self._checked = self.back_end.error_record
        self._targets = sorted(set(self.in_place.values()))  # parameters written in place
        self._copies_targets = self._index_check_may_follow_a_write()
        # whether the code calls BLAS, which runs on the caller's thread meanwhile (pool.hold_blas)
        self._calls_blas = jit.blas_available() and any(
            kernel.kind == "matmul" for kernel in self.fused.kernels)
        self._slot_count = len(self._parameters) + len(self._outputs) + 1
        # checked code keeps its error record after the temporaries
        self._arena_size = self.plan.arena_size + (RECORD_BYTES if self._checked else 0)
        self._arena, address = self._new_arena()
        self._free_arena = [address]  # empty while a call runs on it

    def _load(self, objects: list[bytes], cache: ObjectCache) -> bool:
        """Run `objects` from the disk cache; False if LLVM refuses them (an entry this user's
        processes wrote, so only a bug of ours: the caller compiles again)."""
        try:
            self._link(objects)
        except RuntimeError as error:
            LOG.warning("%s: could not load the disk cache entry %s (%s); compiling it again",
                        self.function.name, cache.path, error)
            return False
        jit.count("disk_hits")
        LOG.debug("disk cache hit: %s", cache.path)
        return True

    def _link(self, objects: list[bytes]) -> None:
        """Link `objects` (the thread pool first if they call it) and bind their entry points as
        Python callables."""
        if any(pool.needed_by(code) for code in objects):
            pool.start()
        self._jit = jit.JitModule.link(objects)
        self._entry = _ENTRY(self._jit.address("tracer_entry"))
        self._counters = None
        if self.profiling:
            self._counters = (ctypes.c_int64 * (2 * len(self.fused.kernels))).from_address(
                self._jit.global_address("tracer_profile"))
        self._fast = None
        if self.settings.layout is not None:
            objects = len(self.function.parameters) + len(self.plan.output_slots)
            prototype = ctypes.CFUNCTYPE(ctypes.c_int, *[ctypes.c_void_p] * (objects + 1))
            self._fast = prototype(self._jit.address("tracer_fast"))

    @property
    def loops(self) -> LoopProgram:
        """The loop IR (the `loops` stage), scheduled when compiling and otherwise only when asked
        for (a disk-cache hit runs without it)."""
        return self.back_end.loops

    @property
    def kernels(self) -> list[LoopKernel]:
        return self.loops.kernels

    @property
    def llvm_ir(self) -> str:
        """The LLVM IR text, rendered when compiling and otherwise only when asked for."""
        return self.back_end.llvm_ir

    @property
    def sites(self) -> Sites | None:
        """The checked accesses (codegen.bounds.Sites): the bounds-checked mode's and the index
        checks of gather and scatter; None when there are none."""
        return self.back_end.sites

    def _index_check_may_follow_a_write(self) -> bool:
        """Whether a kernel that checks gather or scatter indices runs at or after one that writes
        a parameter in place: then a failed check would leave that argument changed, so such
        calls write into private copies of the targets, which the caller copies back only when
        the call succeeds. (Commonly the update of a training step comes last and depends on
        every gather, so no copy is made.)"""
        kernels = self.fused.kernels
        checking = [n for n, kernel in enumerate(kernels)
                    if any(can_fail(i) for i in kernel.instructions)]
        writing = [n for n, kernel in enumerate(kernels)
                   if any(self.plan.write(v).kind == "parameter" for v in kernel.results)]
        return bool(checking and writing) and min(writing) <= max(checking)

    def _new_arena(self) -> tuple[np.ndarray, int]:
        storage = np.empty(self._arena_size + ALIGNMENT, np.uint8)
        address = storage.ctypes.data
        return storage, address + (-address % ALIGNMENT)

    def __call__(self, arguments: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Run on `arguments`; the fast path hands the arrays themselves to the native code, which
        reads their data pointers and checks their flags (falling back here if it refuses)."""
        fast = None if self._copies_targets else self._fast
        if fast is not None and len(arguments) == len(self._parameters):
            for argument, (shape, dtype) in zip(arguments, self._parameters):
                if (type(argument) is not np.ndarray or argument.shape != shape
                        or (argument.dtype is not dtype and argument.dtype != dtype)):
                    break
            else:
                outputs = [np.empty(shape, dtype) for shape, dtype in self._outputs]
                # The objects' addresses (ctypes converts integers faster than objects): the
                # lists `arguments` and `outputs` keep them alive until the call returns.
                if self._run(fast, list(map(id, [*arguments, *outputs]))) == 0:
                    return outputs if self._returns_outputs else self._results(arguments, outputs)
        return self._call(arguments)

    def _results(self, parameters: Sequence[np.ndarray],
                 outputs: list[np.ndarray]) -> list[np.ndarray]:
        return [parameters[-1 - slot] if slot < 0 else outputs[slot].copy() if duplicate
                else outputs[slot] for slot, duplicate in self._returns]

    def _call(self, arguments: Sequence[np.ndarray]) -> list[np.ndarray]:
        """The general path: converts, copies and checks everything in Python."""
        if len(arguments) != len(self._parameters):
            raise ValueError(f"{self.function.name} takes {len(self._parameters)} arguments, "
                             f"got {len(arguments)}")
        pointers = np.empty(self._slot_count, np.uintp)
        keep_alive = []
        for position, (argument, (shape, dtype)) in enumerate(zip(arguments, self._parameters)):
            array = np.asarray(argument, dtype)
            if array.shape != shape:
                raise ValueError(f"argument {position} of {self.function.name} has shape "
                                 f"{array.shape}, expected {shape}")
            if not array.flags.c_contiguous:
                array = np.ascontiguousarray(array)
            keep_alive.append(array)
            pointers[position] = array.ctypes.data
        # decided on the arrays as passed, before any is replaced, so that two targets sharing
        # memory both run on copies (and are copied back in the caller's order)
        private = [position for position in self._targets
                   if self._copies_targets or keep_alive[position] is not arguments[position]
                   or not keep_alive[position].flags.writeable
                   or _overlaps(position, keep_alive, pointers)]
        for position in private:  # written on a private copy, which the caller copies back
            array = keep_alive[position] = np.array(keep_alive[position], copy=True)
            pointers[position] = array.ctypes.data
        outputs = [np.empty(shape, dtype) for shape, dtype in self._outputs]
        base = len(self._parameters)
        for position, output in enumerate(outputs):
            pointers[base + position] = output.ctypes.data
        self._run(self._run_entry, [pointers])
        return self._results(keep_alive, outputs)

    def _run_entry(self, pointers: np.ndarray, arena_address: int) -> int:
        pointers[-1] = arena_address
        self._entry(pointers.ctypes.data)
        return 0

    def _run(self, native: Callable[..., int], arguments: list) -> int:
        """`native(*arguments, arena address)` on the one arena every call reuses, or on a fresh
        one while another call holds it; returns its status (0: the entry ran). In code with
        checks, raises the BoundsError or IndexOutOfRangeError the entry recorded in the arena
        (read before the arena is free)."""
        try:
            address = self._free_arena.pop()  # atomic: a concurrent call finds the list empty
            arena = None
        except IndexError:
            arena, address = self._new_arena()  # kept alive until the call has returned
        pool.hold_blas(self._calls_blas)
        try:
            status = native(*arguments, address)
            failure = self._bounds_failure(address) if self._checked and status == 0 else None
        finally:
            pool.release_blas(self._calls_blas)
            if arena is None:
                self._free_arena.append(address)
        if failure is not None:
            error, message, line = failure
            raise error(message, line or None)
        return status

    def _bounds_failure(self, arena_address: int) -> tuple[type, str, str] | None:
        """The error class, message and user line of the failed check the error record holds, if
        any."""
        code, offset = (ctypes.c_int64 * 2).from_address(arena_address + self.plan.arena_size)
        if code == 0:
            return None
        if self.sites.is_callback(code - 1):
            callbacks.raise_failure()  # what the Python code raised
        error = IndexOutOfRangeError if self.sites.is_index(code - 1) else BoundsError
        return (error, *self.sites.message(code - 1, offset))

    def kernel_times(self) -> list[KernelTime]:
        """Calls and total run time of each kernel so far; empty unless compiled with
        TRACER_PROFILE=1."""
        if self._counters is None:
            return []
        counts = list(self._counters)
        return [KernelTime(code.name, counts[2 * i], counts[2 * i + 1] * 1e-9)
                for i, code in enumerate(self.kernels)]

    def stage_text(self, stage: str) -> str:
        """The printed form of a back-end stage: "fused", "loops", "llvm" (optimized) or
        "asm"."""
        if stage not in BACK_END_STAGES:
            raise ValueError(f"unknown stage {stage!r}; expected one of "
                             f"{', '.join(BACK_END_STAGES)}")
        if stage not in self._stages:
            if stage == "fused":
                self._stages[stage] = format_fused(self.fused)
            elif stage == "loops":
                self._stages[stage] = format_program(self.loops)
            elif stage == "llvm":
                self._stages[stage] = stage_text(self.back_end.code, jit.optimized_ir)
            else:
                self._stages[stage] = stage_text(self.back_end.code, jit.assembly)
        return self._stages[stage]


# Shared by every traced function whose signature gives the same graph, and only while one of them
# holds it: the native code is freed with the last reference.
_compiled: weakref.WeakValueDictionary[tuple, CompiledFunction] = weakref.WeakValueDictionary()
_compiled_lock = threading.Lock()


def _overlaps(position: int, arrays: list[np.ndarray], pointers: np.ndarray) -> bool:
    """Whether the (contiguous) buffer of arrays[position] shares a byte with another one's."""
    size = arrays[position].nbytes
    if size == 0:
        return False
    start = int(pointers[position])
    for other, array in enumerate(arrays):
        if other != position and array.nbytes:
            begin = int(pointers[other])
            if start < begin + array.nbytes and begin < start + size:
                return True
    return False


def compile_function(function: Function,
                     write_into: dict[int, int] | None = None) -> CompiledFunction:
    """The CompiledFunction of `function` (the `optimized` stage), shared in memory by its text
    (and the settings that change the generated code) while it is in use."""
    write_into = dict(write_into or {})
    settings = CodeSettings.current()
    key = (format_function(function), tuple(sorted(write_into.items())), settings,
           cache_directory())
    with _compiled_lock:
        compiled = _compiled.get(key)
    if compiled is not None:
        LOG.debug("%s: in-memory hit, the same optimized graph was compiled before",
                  function.name)
    else:
        compiled = CompiledFunction(function, write_into, settings)
        with _compiled_lock:
            compiled = _compiled.setdefault(key, compiled)
    return compiled
