"""A compiled Function: the object code runtime/pipeline.py made for its memory plan, loaded, with
one native entry point.

    compiled = pipeline.compile_function(ir.optimize(function))
    outputs = compiled([x, w])          # numpy arrays in, fresh numpy arrays out

Loading fixes what does not depend on the argument values: the output shapes and dtypes and the
layout of the pointer array. A call allocates the outputs and hands both lists of arrays to the
fast entry, a builtin made of native code that checks the arguments and runs the code with the
GIL released; where it refuses them (or was not built), the general path converts the arguments
to C-contiguous arrays of the parameter dtypes, fills the pointer array and makes one ctypes call,
which releases the GIL.

With TRACER_CHECK_BOUNDS=1 (read at compile time) the code is bounds-checked (codegen/bounds.py):
a call whose native code caught an access outside a buffer raises `tr.BoundsError`. The indices of
gather and scatter are checked always: one out of range raises `tr.IndexOutOfRangeError`, and the
arguments are unchanged (see `CompiledFunction._copies_targets`).
"""
from __future__ import annotations

import ctypes
import math
import sys
from typing import TYPE_CHECKING, Callable, NamedTuple, Sequence

import numpy as np

from tracer.runtime import callbacks, native, pool
from tracer.runtime.arena import ArenaAhead, new_arena
from tracer.errors import BoundsError, IndexOutOfRangeError

if TYPE_CHECKING:
    from tracer.codegen.bounds import Sites
    from tracer.ir.fusion import FusedFunction
    from tracer.ir.graph import Graph
    from tracer.ir.loops import LoopKernel, LoopProgram
    from tracer.ir.memory import MemoryPlan
    from tracer.runtime.pipeline import BackEnd

_ENTRY = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
# Up to this many bytes of one call's outputs are kept for the next (see `_new_outputs`).
SPARE_BYTES = 1 << 30


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

    def __init__(self, back_end: "BackEnd", objects: list[bytes], from_disk_cache: bool,
                 arena: ArenaAhead | None = None):
        """Load `objects`, the code runtime/pipeline.py made (or found in the disk cache) for the
        plan of `back_end` (and `arena`, of its size, made ahead); raises RuntimeError if LLVM
        refuses them."""
        self.back_end = back_end
        self.settings = back_end.settings
        self.profiling = self.settings.profile
        self.timings: dict[str, float] = back_end.timings  # seconds per back-end step
        self.disk_key: bytes = back_end.disk_key
        self.from_disk_cache = from_disk_cache
        convention = self.convention = back_end.convention
        self.in_place: dict[int, int] = dict(convention.in_place)
        self._link(objects)
        self._parameters, self._outputs = convention.parameters, convention.outputs
        # per result: (output slot, whether it must copy an earlier result); in-place results are
        # (-1 - parameter index, False)
        self._returns = convention.returns
        # (position, earlier position): outputs of the same value, copied unless the caller
        # shares them (see __call__)
        self.duplicates: list[tuple[int, int]] = convention.duplicates
        # the common case: each result is its own output slot, in order
        self._returns_outputs = self._returns == [(i, False) for i in range(len(self._outputs))]
        # whether every result is an array the call allocates (none is an argument's own)
        self.fresh_results = all(slot >= 0 for slot, _ in self._returns)
        self._checked = convention.error_record
        self._targets = sorted(set(self.in_place.values()))  # parameters written in place
        # Whether a kernel that checks gather or scatter indices runs at or after one that writes
        # a parameter in place: then a failed check would leave that argument changed, so such
        # calls write into private copies of the targets, which the caller copies back only when
        # the call succeeds. (Commonly the update of a training step comes last and depends on
        # every gather, so no copy is made.)
        self._copies_targets = convention.copies_targets
        # the fast entry, where a call may write into the argument arrays themselves
        self._fast_call = None if self._copies_targets else self._fast
        # whether the code calls BLAS, which runs on the caller's thread meanwhile (pool.hold_blas)
        self._calls_blas = convention.matmul and native.blas_available()
        self._slot_count = len(self._parameters) + len(self._outputs) + 1
        self._arena_size = convention.arena_size
        self._arena, address = arena.take() if arena is not None else new_arena(self._arena_size)
        self._free_arena = [address]  # empty while a call runs on it
        # the outputs of an earlier call, for the next (see `_new_outputs`)
        self._spare_outputs: list[list[np.ndarray]] = []
        self._keeps_outputs = sum(math.prod(shape) * dtype.itemsize
                                  for shape, dtype in self._outputs) <= SPARE_BYTES

    @property
    def function(self) -> Graph:
        """The optimized graph compiled (made again on a warm hit: runtime/warm_cache.py)."""
        return self.back_end.function

    @property
    def fused(self) -> FusedFunction:
        return self.back_end.fused

    @property
    def plan(self) -> MemoryPlan:
        return self.back_end.plan

    def _link(self, objects: list[bytes]) -> None:
        """Link `objects` (the thread pool first if they call it) and bind their entry points as
        Python callables."""
        if any(pool.needed_by(code) for code in objects):
            pool.start()
        if self.settings.layout is not None:
            native.register_python_api()  # (which the fast entry calls)
        self._jit = native.JitModule.link(objects)
        self._entry = _ENTRY(self._jit.address("tracer_entry"))
        self._counters = None
        if self.profiling:
            self._counters = (ctypes.c_int64 * (2 * self.convention.kernels)).from_address(
                self._jit.global_address("tracer_profile"))
        self._fast = None
        if self.settings.layout is not None:  # (bound to what codegen.module.fast_entry reads)
            self._fast = self._jit.builtin("tracer_fast", (0, 1, list, np.ndarray, *(
                dtype for _, dtype in self.convention.parameters)))

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

    def run(self, arguments: Sequence[np.ndarray], share: bool = False) -> list[np.ndarray]:
        """Run on `arguments`; outputs of the same value (`duplicates`) are copies unless `share`
        (the caller makes one tensor of them). The fast path hands the list of arrays itself to
        the native code, which checks each (an ndarray of the parameter's shape, of its dtype
        object, with the flags it needs) and reads its data pointer, or refuses: then the general
        path converts them here."""
        fast = self._fast_call
        if fast is not None:
            outputs = self._new_outputs()
            if self._run(fast, arguments, outputs) == 0:
                return (outputs if self._returns_outputs
                        else self._results(arguments, outputs, share))
        return self._call(arguments, share)

    __call__ = run  # (a traced function calls `run`: a method call costs less than an object's)

    def _new_outputs(self) -> list[np.ndarray]:
        """Arrays for a call's outputs: those of the previous call that nothing references any
        more (results the caller dropped: the loss and new `.grad` of a training step, dropped by
        `zero_grad`), fresh ones for the others. An output freed and allocated anew is a new
        mapping whose pages the system zeroes on first touch, every call: half the time of a
        4096 x 1024 layer norm's forward and backward (glibc maps allocations that large).

        They are kept for the next call at once: while this call holds them (in the list it
        returns), a concurrent call finds them referenced and allocates its own."""
        try:
            outputs = self._spare_outputs.pop()  # atomic: a concurrent call finds none
        except IndexError:
            outputs = [np.empty(shape, dtype) for shape, dtype in self._outputs]
        else:
            # referenced by the list `outputs` and getrefcount's argument only: unreachable to
            # the caller (a view, a tensor or a tape node holding it would add a reference)
            for slot, (shape, dtype) in enumerate(self._outputs):
                if sys.getrefcount(outputs[slot]) != 2:
                    outputs[slot] = np.empty(shape, dtype)
        if self._keeps_outputs and not self._spare_outputs:
            self._spare_outputs.append(outputs.copy())  # (the caller may change its list)
        return outputs

    def _results(self, parameters: Sequence[np.ndarray], outputs: list[np.ndarray],
                 share: bool) -> list[np.ndarray]:
        return [parameters[-1 - slot] if slot < 0 else outputs[slot].copy()
                if duplicate and not share else outputs[slot] for slot, duplicate in self._returns]

    def _call(self, arguments: Sequence[np.ndarray], share: bool = False) -> list[np.ndarray]:
        """The general path: converts, copies and checks everything in Python."""
        name = self.convention.name
        if len(arguments) != len(self._parameters):
            raise ValueError(f"{name} takes {len(self._parameters)} arguments, "
                             f"got {len(arguments)}")
        pointers = np.empty(self._slot_count, np.uintp)
        keep_alive = []
        for position, (argument, (shape, dtype)) in enumerate(zip(arguments, self._parameters)):
            array = np.asarray(argument, dtype)
            if array.shape != shape:
                raise ValueError(f"argument {position} of {name} has shape "
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
        outputs = self._new_outputs()
        base = len(self._parameters)
        for position, output in enumerate(outputs):
            pointers[base + position] = output.ctypes.data
        self._run(self._run_entry, pointers, None)
        return self._results(keep_alive, outputs, share)

    def _run_entry(self, pointers: np.ndarray, _, arena_address: int) -> int:
        pointers[-1] = arena_address
        self._entry(pointers.ctypes.data)
        return 0

    def _run(self, native: Callable[[object, object, int], int], first, second) -> int:
        """`native(first, second, arena address)` on the one arena every call reuses, or on a fresh
        one while another call holds it; returns its status (0: the entry ran). In code with
        checks, raises the BoundsError or IndexOutOfRangeError the entry recorded in the arena
        (read before the arena is free)."""
        try:
            address = self._free_arena.pop()  # atomic: a concurrent call finds the list empty
            arena = None
        except IndexError:
            arena, address = new_arena(self._arena_size)  # kept alive until the call returns
        blas = self._calls_blas
        if blas:
            pool.hold_blas()
        try:
            status = native(first, second, address)
            failure = self._bounds_failure(address) if self._checked and status == 0 else None
        finally:
            if blas:
                pool.release_blas()
            if arena is None:
                self._free_arena.append(address)
        if failure is not None:
            error, message, line = failure
            raise error(message, line or None)
        return status

    def _bounds_failure(self, arena_address: int) -> tuple[type, str, str] | None:
        """The error class, message and user line of the failed check the error record holds, if
        any."""
        code, offset = (ctypes.c_int64 * 2).from_address(arena_address
                                                         + self.convention.temporaries)
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

    @property
    def compile_steps(self) -> tuple[str, ...]:
        """The back-end steps of compiling (a hit's loop IR and LLVM text, made later if asked
        for, are not)."""
        return self.back_end.compile_steps

    @property
    def stages(self) -> tuple[str, ...]:
        """The stages `stage_text` prints."""
        return self.back_end.stages

    def stage_text(self, stage: str) -> str:
        """The printed form of a back-end stage (see BackEnd.stage_text)."""
        return self.back_end.stage_text(stage)


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
