"""The lowering column of the primitive table: how each primitive becomes LLVM IR.

`LOWERING[primitive]` is a `Lowering(kind, emit)`:

- kind "scalar": an elementwise primitive. `emit(writer, in_dtypes, out_dtype, operands, attributes)`
  writes the instructions for one element (operands are LLVM registers or literals) and returns the
  register holding the result. The loop vectorizer widens these, so none of them calls libm:
  transcendentals are the inline approximations of templates/math.ll.j2.
- kind "index": a layout primitive or a source; it changes which element is read, not the value.
  The scheduler (ir/schedule.py) maps the index (broadcast, transpose, slice, pad, reshape, iota,
  constant).
- kind "reduction": an inline reduction loop or an `accumulate` kernel (ir/schedule.py).
- kind "gather": a load at a computed index inside a loop kernel: each index operand is read at
  the current index (checked there too unless it comes from `check_index` or an `iota` that fits),
  then the operand is read there (ir/schedule.py).
- kind "scatter": its own kernel, a copy of the target then a loop over the updates storing (or
  adding) each at its checked computed index (ir/schedule.py).
- kind "check": `check_index`, computed in a loop kernel over its whole operand (fusion always
  stores it): each index is wrapped if negative and checked against its dimension (always, not only
  under TRACER_CHECK_BOUNDS: an index is data); a gather or scatter then reads the checked index
  as it is.
- kind "matmul": its own kernel (templates/matmul.ll.j2): BLAS gemm or a loop nest.
- kind "collective": `all_reduce`, its own kernel: one call of MPI_Allreduce (codegen/render_kernel.py).
- kind "callback": `host_callback`, its own kernel: one call of the runtime's dispatcher, which
  calls the Python code back (codegen/render_kernel.py, runtime/callbacks.py).
- kind "removed": gradient markers; `ir.optimize` forwards their operands, so none reaches codegen.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Callable

import numpy as np

from tracer.ir.primitives import (BINARY, COMPARE, ELEMENTWISE, GRADIENT_MARKERS, LAYOUT, PRIMITIVES,
                           REDUCE, SOURCES)
from tracer.ir.types import bool_, float32, float64, int64, is_float

# Register types; bool is i1 in registers and one byte (numpy's layout) in memory.
LLVM_TYPE = {float32: "float", float64: "double", int64: "i64", bool_: "i1"}
STORAGE_TYPE = {float32: "float", float64: "double", int64: "i64", bool_: "i8"}
SUFFIX = {float32: "f32", float64: "f64"}
INT64_MIN = -(2 ** 63)
INT64_MAX = 2 ** 63 - 1


def double_hex(value: float) -> str:
    """A float as LLVM's exact hexadecimal double literal (valid for float and double types)."""
    return "0x%016X" % struct.unpack("<Q", struct.pack("<d", float(value)))[0]


def literal(value, dtype: np.dtype) -> str:
    """An LLVM constant of `dtype` holding `value` (rounded to the dtype first)."""
    if dtype == bool_:
        return "true" if bool(value) else "false"
    if dtype == int64:
        return str(int(value))
    return double_hex(float(dtype.type(value)))


# The call-site attribute group (templates/kernel_header.ll.j2) that keeps a math function's call
# out of line.
OUT_OF_LINE = "#4"


class Writer:
    """Accumulates the instructions of one LLVM function body, naming registers and labels.

    While `invariant` is set (the value written does not change in any loop: codegen/
    render_kernel.py), a call of a math function of templates/math.ll.j2 is not inlined: LLVM
    hoists the call out of the loop, which vectorizes as well, and compiles the function once for
    all its calls. Inlined, the 16 pow calls of AdamW's bias corrections (8 parameters in one
    kernel, each `1 - beta ** step` twice) made 18% of the GPT step's LLVM time (the kernel took
    222 ms to compile, 44 ms with the calls out of line; its loop the same 308 vector operations)."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.allocas: list[str] = []
        self.counter = 0
        self.invariant = False

    def fresh(self, hint: str = "v") -> str:
        self.counter += 1
        return f"%{hint}{self.counter}"

    def label(self, hint: str = "L") -> str:
        self.counter += 1
        return f"{hint}{self.counter}"

    def emit(self, text: str) -> None:
        self.lines.append("  " + text)

    def raw(self, text: str) -> None:
        self.lines.append(text)

    def value(self, rhs: str, hint: str = "v") -> str:
        register = self.fresh(hint)
        self.emit(f"{register} = {rhs}")
        return register

    def alloca(self, type_: str, hint: str = "a") -> str:
        register = self.fresh(hint)
        self.allocas.append(f"{register} = alloca {type_}")
        return register

    def call(self, return_type: str, function: str, *arguments: tuple[str, str]) -> str:
        args = ", ".join(f"{t} {a}" for t, a in arguments)
        return self.value(f"call {return_type} @{function}({args})")

    def math_call(self, return_type: str, function: str, *arguments: tuple[str, str]) -> str:
        """A call of a math function of templates/math.ll.j2, kept out of line if `invariant`."""
        register = self.call(return_type, function, *arguments)
        if self.invariant:
            self.lines[-1] += f" {OUT_OF_LINE}"
        return register


@dataclass(frozen=True)
class Lowering:
    kind: str
    emit: Callable[..., str] | None = None


# Elementwise ----------------------------------------------------------------------------------

def _float_intrinsic(name: str):
    def emit(w: Writer, in_dtypes, out_dtype, operands, attributes) -> str:
        t = LLVM_TYPE[in_dtypes[0]]
        return w.call(t, f"llvm.{name}.{SUFFIX[in_dtypes[0]]}", *[(t, o) for o in operands])
    return emit


def _math(name: str):
    def emit(w: Writer, in_dtypes, out_dtype, operands, attributes) -> str:
        t = LLVM_TYPE[in_dtypes[0]]
        return w.math_call(t, f"tracer.{name}.{SUFFIX[in_dtypes[0]]}",
                           *[(t, o) for o in operands])
    return emit


def _arithmetic(float_opcode: str, int_opcode: str):
    def emit(w: Writer, in_dtypes, out_dtype, operands, attributes) -> str:
        dtype = in_dtypes[0]
        opcode = float_opcode if is_float(dtype) else int_opcode
        a, b = operands
        return w.value(f"{opcode} {LLVM_TYPE[dtype]} {a}, {b}")
    return emit


def _neg(w: Writer, in_dtypes, out_dtype, operands, attributes) -> str:
    (x,), dtype = operands, in_dtypes[0]
    if is_float(dtype):
        return w.value(f"fneg {LLVM_TYPE[dtype]} {x}")
    return w.value(f"sub i64 0, {x}")


def _abs(w: Writer, in_dtypes, out_dtype, operands, attributes) -> str:
    (x,), dtype = operands, in_dtypes[0]
    if is_float(dtype):
        return _float_intrinsic("fabs")(w, in_dtypes, out_dtype, operands, attributes)
    return w.call("i64", "llvm.abs.i64", ("i64", x), ("i1", "false"))


def _sign(w: Writer, in_dtypes, out_dtype, operands, attributes) -> str:
    # -1, 0 or 1, as PyTorch (the reference): nan and -0.0 give +0.0 (ordered comparisons are
    # false for nan).
    (x,), dtype = operands, in_dtypes[0]
    t = LLVM_TYPE[dtype]
    if is_float(dtype):
        positive = w.value(f"fcmp ogt {t} {x}, 0.0")
        negative = w.value(f"fcmp olt {t} {x}, 0.0")
        one, minus_one, rest = literal(1, dtype), literal(-1, dtype), literal(0, dtype)
    else:
        positive = w.value(f"icmp sgt i64 {x}, 0")
        negative = w.value(f"icmp slt i64 {x}, 0")
        one, minus_one, rest = "1", "-1", "0"
    low = w.value(f"select i1 {negative}, {t} {minus_one}, {t} {rest}")
    return w.value(f"select i1 {positive}, {t} {one}, {t} {low}")


def _min_max(float_name: str, int_name: str):
    # llvm.maximum/minimum propagate nan, as numpy.maximum/minimum do.
    def emit(w: Writer, in_dtypes, out_dtype, operands, attributes) -> str:
        dtype = in_dtypes[0]
        if is_float(dtype):
            return _float_intrinsic(float_name)(w, in_dtypes, out_dtype, operands, attributes)
        a, b = operands
        return w.call("i64", f"llvm.{int_name}.i64", ("i64", a), ("i64", b))
    return emit


def _pow(w: Writer, in_dtypes, out_dtype, operands, attributes) -> str:
    dtype = in_dtypes[0]
    if is_float(dtype):
        return _math("pow")(w, in_dtypes, out_dtype, operands, attributes)
    return w.math_call("i64", "tracer.pow.i64", ("i64", operands[0]), ("i64", operands[1]))


FLOAT_PREDICATE = {"lt": "olt", "le": "ole", "gt": "ogt", "ge": "oge", "eq": "oeq", "ne": "une"}
INT_PREDICATE = {"lt": "slt", "le": "sle", "gt": "sgt", "ge": "sge", "eq": "eq", "ne": "ne"}
BOOL_PREDICATE = {"lt": "ult", "le": "ule", "gt": "ugt", "ge": "uge", "eq": "eq", "ne": "ne"}


def _compare(name: str):
    def emit(w: Writer, in_dtypes, out_dtype, operands, attributes) -> str:
        dtype = in_dtypes[0]
        a, b = operands
        if is_float(dtype):
            return w.value(f"fcmp {FLOAT_PREDICATE[name]} {LLVM_TYPE[dtype]} {a}, {b}")
        table = BOOL_PREDICATE if dtype == bool_ else INT_PREDICATE
        return w.value(f"icmp {table[name]} {LLVM_TYPE[dtype]} {a}, {b}")
    return emit


def _logical(opcode: str):
    def emit(w: Writer, in_dtypes, out_dtype, operands, attributes) -> str:
        return w.value(f"{opcode} i1 {operands[0]}, {operands[1]}")
    return emit


def _logical_not(w: Writer, in_dtypes, out_dtype, operands, attributes) -> str:
    return w.value(f"xor i1 {operands[0]}, true")


def _select(w: Writer, in_dtypes, out_dtype, operands, attributes) -> str:
    condition, on_true, on_false = operands
    t = LLVM_TYPE[out_dtype]
    return w.value(f"select i1 {condition}, {t} {on_true}, {t} {on_false}")


def cast(w: Writer, source: np.dtype, target: np.dtype, x: str) -> str:
    if source == target:
        return x
    s, t = LLVM_TYPE[source], LLVM_TYPE[target]
    if is_float(source) and is_float(target):
        return w.value(f"{'fpext' if target == float64 else 'fptrunc'} {s} {x} to {t}")
    if is_float(source) and target == int64:
        # Out of range and nan give INT64_MIN, as numpy does on x86 (cvttsd2si).
        magnitude = _float_intrinsic("fabs")(w, [source], source, [x], {})
        in_range = w.value(f"fcmp olt {s} {magnitude}, {literal(2.0 ** 63, source)}")
        converted = w.value(f"fptosi {s} {x} to i64")
        return w.value(f"select i1 {in_range}, i64 {converted}, i64 {INT64_MIN}")
    if is_float(source) and target == bool_:
        return w.value(f"fcmp une {s} {x}, 0.0")
    if source == int64 and is_float(target):
        return w.value(f"sitofp i64 {x} to {t}")
    if source == int64 and target == bool_:
        return w.value(f"icmp ne i64 {x}, 0")
    if source == bool_ and is_float(target):
        return w.value(f"uitofp i1 {x} to {t}")
    if source == bool_ and target == int64:
        return w.value(f"zext i1 {x} to i64")
    raise NotImplementedError(f"cast from {source} to {target}")


def _cast(w: Writer, in_dtypes, out_dtype, operands, attributes) -> str:
    return cast(w, in_dtypes[0], out_dtype, operands[0])


def _table() -> dict[str, Lowering]:
    scalar: dict[str, Callable[..., str]] = {
        "neg": _neg, "abs": _abs, "sign": _sign, "sqrt": _float_intrinsic("sqrt"),
        "exp": _math("exp"), "log": _math("log"), "tanh": _math("tanh"),
        "sin": _math("sin"), "cos": _math("cos"), "logical_not": _logical_not,
        "add": _arithmetic("fadd", "add"), "sub": _arithmetic("fsub", "sub"),
        "mul": _arithmetic("fmul", "mul"), "div": _arithmetic("fdiv", "sdiv"),
        "fmod": _arithmetic("frem", "srem"),  # frem is C's fmod (a libm call)
        "pow": _pow, "maximum": _min_max("maximum", "smax"), "minimum": _min_max("minimum", "smin"),
        "logical_and": _logical("and"), "logical_or": _logical("or"),
        "select": _select, "cast": _cast,
    }
    scalar.update({name: _compare(name) for name in COMPARE})
    table = {name: Lowering("scalar", emit) for name, emit in scalar.items()}
    table.update({name: Lowering("index") for name in LAYOUT | SOURCES})
    table.update({name: Lowering("reduction") for name in REDUCE})
    table["matmul"] = Lowering("matmul")
    table["gather"] = Lowering("gather")
    table["scatter"] = Lowering("scatter")
    table["check_index"] = Lowering("check")
    table["all_reduce"] = Lowering("collective")
    table["host_callback"] = Lowering("callback")
    table.update({name: Lowering("removed") for name in GRADIENT_MARKERS})
    return table


LOWERING = _table()
assert set(LOWERING) == PRIMITIVES, set(LOWERING) ^ PRIMITIVES
assert {name for name, entry in LOWERING.items() if entry.kind == "scalar"} == ELEMENTWISE
assert BINARY <= set(LOWERING)
