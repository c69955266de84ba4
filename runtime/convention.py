"""How a compiled program is called: what runtime/compiled.py needs to run its object code, and
nothing else -- the parameters' and outputs' shapes and dtypes, which result is which output (or
which argument, written in place), the arena's size and whether the code keeps an error record.

It is made from the back end's stages (the fused kernels and the memory plan) when compiling, and
stored with the object code in the disk cache entry keyed by the `grad` stage
(runtime/warm_cache.py): a warm hit then runs the code without optimizing, fusing or planning
memory, which are made again only if something asks for them (a stage's text, a failed check's
message).
"""
from __future__ import annotations

import ast
from typing import TYPE_CHECKING

import numpy as np

from tracer.ir.index_checks import can_fail

if TYPE_CHECKING:
    from tracer.runtime.pipeline import BackEnd

Shape = tuple[int, ...]


class CallingConvention:
    """`parameters` and `outputs`: (shape, dtype) of each parameter and output slot; `returns`:
    per result, (output slot, whether it repeats an earlier result), or (-1 - parameter, False)
    for a result written into that parameter in place (`in_place`: {result: parameter});
    `duplicates`: (result, earlier result) of the same value; `copies_targets`: whether a
    kernel that checks indices runs at or after one writing a parameter in place (see
    CompiledFunction); `matmul`: whether a kernel is a product (which calls BLAS);
    `temporaries`: the arena's bytes before the error record, if `error_record`; `arena_size`:
    its bytes in all; `kernels`: how many (TRACER_PROFILE's counters)."""

    def __init__(self, name: str, parameters: list[tuple[Shape, np.dtype]],
                 outputs: list[tuple[Shape, np.dtype]], returns: list[tuple[int, bool]],
                 in_place: dict[int, int], copies_targets: bool, matmul: bool,
                 error_record: bool, temporaries: int, arena_size: int, kernels: int):
        self.name, self.parameters, self.outputs = name, parameters, outputs
        self.returns, self.in_place = returns, in_place
        self.copies_targets, self.matmul = copies_targets, matmul
        self.error_record, self.temporaries, self.arena_size = error_record, temporaries, arena_size
        self.kernels = kernels
        self.duplicates: list[tuple[int, int]] = []
        first: dict[int, int] = {}  # output slot -> the first result returning it
        for position, (slot, repeated) in enumerate(returns):
            if repeated:
                self.duplicates.append((position, first[slot]))
            first.setdefault(slot, position)

    @classmethod
    def of(cls, back_end: BackEnd) -> CallingConvention:
        """The convention of the code compiled for `back_end`'s plan."""
        function, plan, kernels = back_end.function, back_end.plan, back_end.fused.kernels
        slot_of = {id(v): i for i, v in enumerate(plan.output_slots)}
        returned: set[int] = set()
        returns = []
        for position, value in enumerate(function.outputs):
            if position in plan.in_place:
                returns.append((-1 - plan.in_place[position], False))
            else:
                returns.append((slot_of[id(value)], id(value) in returned))
                returned.add(id(value))
        checking = [n for n, kernel in enumerate(kernels)
                    if any(can_fail(i) for i in kernel.instructions)]
        writing = [n for n, kernel in enumerate(kernels)
                   if any(plan.write(v).kind == "parameter" for v in kernel.results)]
        return cls(function.name, [(p.shape, p.dtype) for p in function.parameters],
                   [(v.shape, v.dtype) for v in plan.output_slots], returns, dict(plan.in_place),
                   bool(checking and writing) and min(writing) <= max(checking),
                   any(kernel.kind == "matmul" for kernel in kernels), back_end.error_record,
                   plan.arena_size, back_end.arena_size, len(kernels))

    def to_bytes(self) -> bytes:
        # (Python literals, read back by ast.literal_eval: json is not imported by a warm process)
        def types(pairs: list[tuple[Shape, np.dtype]]) -> list[tuple[Shape, str]]:
            return [(tuple(map(int, shape)), dtype.str) for shape, dtype in pairs]
        return repr((
            self.name, types(self.parameters), types(self.outputs),
            [(int(slot), bool(repeated)) for slot, repeated in self.returns],
            sorted((int(k), int(v)) for k, v in self.in_place.items()),
            bool(self.copies_targets), bool(self.matmul), bool(self.error_record),
            int(self.temporaries), int(self.arena_size), int(self.kernels))).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> CallingConvention:
        """The convention `to_bytes` wrote (read from an entry this user's processes wrote, whose
        HMAC matched: see runtime/cache.py)."""
        (name, parameters, outputs, returns, in_place, copies_targets, matmul, error_record,
         temporaries, arena_size, kernels) = ast.literal_eval(data.decode())
        return cls(name, [(shape, np.dtype(dtype)) for shape, dtype in parameters],
                   [(shape, np.dtype(dtype)) for shape, dtype in outputs], returns, dict(in_place),
                   copies_targets, matmul, error_record, temporaries, arena_size, kernels)
