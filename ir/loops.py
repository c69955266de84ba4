"""The loop-level kernel IR: the `loops` stage, between fusion and LLVM.

A `LoopProgram` is what the native entry runs: its kernels in order, each a function of the
buffers it reads and writes (pointers into the parameters, the outputs and the arena, as the
memory plan placed them) whose body is a tree of statements:

- `Loop`: a counted loop; the kernel's outermost loop may run over the range [begin, end) that
  the entry passes (and splits across threads), every other loop over fixed bounds or bounds in
  `IndexOp` registers (the rows of one chunk of a row kernel, ir/schedule_reduce.py; the part of
  a concatenation's piece in the range: index operations may read `begin` and `end`).
- `Load` / `Store`: one element of a buffer at an element offset, an `IndexOp` register or an
  int. Offsets are computed, not assumed affine, so a gather's index read from memory fits.
- `Compute`: one scalar primitive, exactly a row of the lowering table (codegen/lowering.py).
- `IndexOp`: i64 arithmetic on offsets (never wrapping: offsets are small and nonnegative, except
  a padded position below its low edge, whose unsigned comparison fails).
- `CheckIndex`: an index read from data (a gather's or scatter's), checked against its dimension
  (and wrapped if negative, where negative indices count from the end); out of range, the kernel records the index in the error record and
  returns before any access at it, and the entry runs no later kernel.
- `Accumulator` / `Accumulate`: a reduction's running value (reassociable, so it vectorizes).
- `Gemm`: C[b] (+)= alpha * A[b] @ B[b] for the batch range [begin, end) (or blocks of rows or
  columns of each C[b]), a BLAS call or a loop nest.
- `AllReduce`: the target buffer is the elementwise sum (max, min) of the source buffer over the
  processes of an MPI job, one call of the MPI library (MPI_Allreduce); alone, a copy.
- `HostCall`: result buffers written by Python code the program calls back (ir/host.py).

Registers are written once (`%v3`), except accumulators, which `Accumulate` updates in place. A
register defined inside a loop is used only inside it; an accumulator is read after its loops.
codegen/render_kernel.py renders a program to LLVM IR and ir/loop_interpreter.py runs it in numpy, so the
schedule can be checked without LLVM. The printed form (ir/loop_printing.py) is the `loops` stage.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Union

import numpy as np

from tracer.ir.graph import Value
from tracer.ir.memory import Location
from tracer.ir.types import is_float

# A register ("%v3", "%i0") or a literal (a Python bool, int or float in the operand's dtype).
Operand = Union[str, bool, int, float]
# "begin" and "end" name the kernel's range, which the entry passes; any other string is an
# `IndexOp` register defined before the loop.
Bound = Union[int, str]

# The operations of IndexOp (the renderer and the interpreter each implement all of them).
INDEX_OPS = ("add", "sub", "mul", "div", "rem", "lt", "eq", "and", "select")


@dataclass(frozen=True)
class Buffer:
    """A pointer parameter of a kernel: the buffer of `value`, where the memory plan put it.

    An input and a result written in place into it share one pointer (so `noalias` holds)."""

    name: str  # "in0", "out0"
    value: Value
    location: Location
    # elements from the buffer's start to where the kernel's pointer points (ir/offsets.py)
    shift: int = 0

    def __str__(self) -> str:
        where = (f"arena+{self.location.index}" if self.location.kind == "arena"
                 else f"{self.location.kind} {self.location.index}")
        shifted = f", from element {self.shift}" if self.shift else ""
        return f"{self.name} = %{self.value.name}: {self.value.type} ({where}{shifted})"


@dataclass(eq=False)
class Compute:
    """target = primitive(operands): one element of an elementwise primitive."""

    target: str
    primitive: str
    operands: tuple
    in_dtypes: tuple
    dtype: np.dtype
    attributes: dict[str, Any] = field(default_factory=dict)
    line: str = ""


@dataclass(eq=False)
class IndexOp:
    """target = op(operands) on i64 offsets ("lt" compares unsigned; "and", "select" on its i1)."""

    target: str
    op: str
    operands: tuple


@dataclass(eq=False)
class CheckIndex:
    """target = position (+ size if negative), after checking -size <= position < size: the
    index operand `operand` (a Value of the program, for the error message) into dimension
    `axis` of `size` elements. A failed check stops the kernel and the program."""

    target: str
    position: Operand
    size: int
    operand: Value
    axis: int
    line: str = ""
    wrap: bool = True  # a negative index counts from the end; without, it is out of range


@dataclass(eq=False)
class Load:
    target: str
    buffer: str
    offset: Operand
    value: Value  # whose element is read: its dtype, and the name a failed bounds check gives
    line: str = ""


@dataclass(eq=False)
class Store:
    buffer: str
    offset: Operand
    operand: Operand
    value: Value  # whose element is written
    line: str = ""


@dataclass(eq=False)
class Loop:
    counter: str
    begin: Bound
    end: Bound
    body: list = field(default_factory=list)


@dataclass(eq=False)
class Accumulator:
    """Declares `name` holding `initial`; an `Accumulate` in the loops after it updates it."""

    name: str
    dtype: np.dtype
    initial: Operand


@dataclass(eq=False)
class Accumulate:
    """name = primitive(name, operand), primitive "add", "maximum" or "minimum"."""

    name: str
    primitive: str
    operand: Operand
    dtype: np.dtype


@dataclass(eq=False)
class Gemm:
    """c[b] = a[b] @ b[b] (or c[b] += alpha * a[b] @ b[b] with `accumulate`); `a` (or `b`) holds
    its operand with the last two axes swapped when transposed. Each matrix of the batch is cut
    into `blocks` blocks of `rows` rows or of `columns` columns of c (the last one shorter; the
    other length is the whole matrix's): task t of the kernel's range is block t % blocks of
    batch t // blocks, so that threads can split one large product."""

    a: str
    b: str
    c: str
    result: Value  # whose buffer c is
    m: int
    n: int
    k: int
    transpose_a: bool
    transpose_b: bool
    dtype: np.dtype
    accumulate: bool = False
    alpha: Operand = 1
    line: str = ""
    blocks: int = 1
    rows: int = 0  # of each block: m when there is one block or blocks of columns
    columns: int = 0  # of each block: n unless the blocks are of columns

    def __post_init__(self):
        self.rows = self.rows or self.m
        self.columns = self.columns or self.n


@dataclass
class AllReduce:
    """target = the elementwise `op` ("sum", "max", "min") of source over every process."""

    source: str
    target: str
    result: Value  # whose buffer target is
    count: int
    dtype: np.dtype
    op: str
    line: str = ""


@dataclass
class HostCall:
    """results = callback(operands), Python code called back on the host (ir/host.py): the
    buffers `operands` in, the buffers `results` (of `values`) written. It can fail (the callback
    raised): then the kernel records the failure and the entry runs no later kernel."""

    callback: object  # an ir.host.HostCallback
    operands: list[str]
    results: list[str]
    operand_values: list[Value]  # whose buffers operands are
    values: list[Value]  # whose buffers results are
    line: str = ""


Statement = Union[Compute, IndexOp, CheckIndex, Load, Store, Loop, Accumulator, Accumulate, Gemm,
                  AllReduce, HostCall]


@dataclass(eq=False)
class LoopKernel:
    """One kernel: the entry calls it with its buffers and the range [0, extent), cut into
    `chunks` contiguous chunks that `threads` threads take from one counter when threads > 1
    (more chunks than threads, so that a thread the machine has descheduled holds up little)."""

    name: str
    kind: str  # the fused kernel's: "loop", "accumulate", "scatter", "matmul", "all_reduce",
    # "host_callback", "rows", "combine"
    buffers: list[Buffer]
    body: list
    extent: int
    threads: int = 1
    chunks: int = 1
    rows: int = 0  # the rows a row kernel's chunks cover (1 for every other kernel)

    @property
    def splittable(self) -> bool:
        """Whether disjoint parts of the range may run at once: a loop kernel's iterations are
        independent and so are a row kernel's chunks (each writes its own rows and partial
        results), and so are a matmul kernel's blocks of its product unless it first
        stores the rest of an update over the whole result (a loop over fixed bounds, where a
        loop over its tasks' elements stores theirs); an accumulate kernel's add into the same
        elements and a combine kernel is small."""
        if self.kind == "matmul":
            return not any(isinstance(statement, Loop) and isinstance(statement.end, int)
                           for statement in self.body)
        return self.kind in ("loop", "rows")


@dataclass(eq=False)
class LoopProgram:
    name: str
    parameters: list[Value]
    output_slots: list[Value]  # the value each fresh output buffer receives
    returns: list[Location]  # where each output of the function is after the kernels ran
    arena_size: int
    kernels: list[LoopKernel]


def nested_statements(statements: list):
    """Every statement of `statements` and, inside each loop, of its body, in order."""
    for statement in statements:
        yield statement
        if isinstance(statement, Loop):
            yield from nested_statements(statement.body)


def rewrite_loops(statements: list, rewrite) -> list:
    """`statements` with every loop, innermost first (its body rewritten before it), replaced by
    the list of statements `rewrite(loop)` gives, or kept where it gives None: the walk the loop
    passes that change loops in place share (ir/reciprocals.py, ir/loop_split.py, ir/one_hot.py)."""
    result: list = []
    for statement in statements:
        if isinstance(statement, Loop):
            statement.body = rewrite_loops(statement.body, rewrite)
            replacement = rewrite(statement)
            if replacement is not None:
                result += replacement
                continue
        result.append(statement)
    return result


def innermost(loop: Loop) -> bool:
    """Whether `loop` holds no loop."""
    return not any(isinstance(statement, Loop) for statement in loop.body)


def checks_indices(program: LoopProgram) -> bool:
    """Whether any kernel of `program` checks an index (and so takes the error record)."""
    return any(isinstance(statement, CheckIndex) for kernel in program.kernels
               for statement in nested_statements(kernel.body))


# Reductions --------------------------------------------------------------------------------------

# The scalar primitive (of `Accumulate`) that combines a reduction's accumulator with one element.
COMBINE = {"reduce_sum": "add", "reduce_max": "maximum", "reduce_min": "minimum"}
INT64_MIN, INT64_MAX = -(2 ** 63), 2 ** 63 - 1


def literal(value, dtype: np.dtype):
    """`value` rounded to `dtype`, as the Python bool, int or float a loop IR operand holds."""
    return np.asarray(value, dtype).item()


def line_of(value: Value) -> str:
    """The user's line that computed `value` ("" for a parameter): what statements computing
    for it show."""
    return "" if value.producer is None else value.producer.location


def initial_value(primitive: str, dtype: np.dtype):
    """What a reduction starts from: 0, or the identity of max/min (-inf, INT64_MIN, ...)."""
    if primitive == "reduce_sum":
        return literal(0, dtype)
    low = primitive == "reduce_max"
    if is_float(dtype):
        return -np.inf if low else np.inf
    return INT64_MIN if low else INT64_MAX
