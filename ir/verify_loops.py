"""The loop IR's verifier: every register defined once before its uses in an enclosing block."""
from __future__ import annotations

from tracer.ir.loops import (INDEX_OPS, Accumulate, Accumulator, AllReduce, CheckIndex, Compute,
                             Gemm, HostCall, IndexOp, Load, Loop, LoopKernel, LoopProgram, Store)
from tracer.ir.verify import VerificationError


def verify_loops(program: LoopProgram) -> None:
    """Raise VerificationError naming the first ill-formed statement of a loop program: every
    register is defined once and used only after its definition in the same or an enclosing
    block (a loop's counter inside it), every buffer named is one of the kernel's, every index
    operation is one of INDEX_OPS, every loop bound an int, the kernel's begin or end or a
    register defined before the loop, and every checked index's dimension size an int >= 0."""
    for kernel in program.kernels:
        verify_kernel(kernel)


def verify_kernel(kernel: LoopKernel) -> None:
    """verify_loops for one kernel (the back end verifies each as it is scheduled)."""
    # the kernel's range, begin and end, is defined throughout
    _verify_block(kernel, kernel.body, [{"begin", "end"}], {"begin", "end"},
                  {b.name for b in kernel.buffers})


def _verify_block(kernel: LoopKernel, statements: list, scopes: list[set[str]],
                  defined: set[str], buffers: set[str], counter: str | None = None) -> None:
    scope: set[str] = set()
    scopes.append(scope)

    def fail(problem: str, statement) -> VerificationError:
        return VerificationError(f"{kernel.name}: {problem} in {statement!r}")

    def define(name: str, statement) -> None:
        if name in defined:
            raise fail(f"{name} is defined twice", statement)
        defined.add(name)
        scope.add(name)

    def use(statement, *operands) -> None:
        for operand in operands:
            if isinstance(operand, str) and not any(operand in s for s in scopes):
                raise fail(f"{operand} is used where it is not defined", statement)

    def buffer(statement, *names: str) -> None:
        for name in names:
            if name not in buffers:
                raise fail(f"{name} is not a buffer of the kernel", statement)

    if counter is not None:
        define(counter, counter)
    for statement in statements:
        if isinstance(statement, Loop):
            for bound in (statement.begin, statement.end):
                if not isinstance(bound, (int, str)):
                    raise fail(f"the loop bound {bound!r} is neither an int, begin/end nor a "
                               f"register", statement.counter)
                if bound not in ("begin", "end"):
                    use(statement.counter, bound)
            _verify_block(kernel, statement.body, scopes, defined, buffers, statement.counter)
        elif isinstance(statement, (Compute, IndexOp)):
            if isinstance(statement, IndexOp) and statement.op not in INDEX_OPS:
                raise fail(f"unknown index operation {statement.op}", statement)
            use(statement, *statement.operands)
            define(statement.target, statement)
        elif isinstance(statement, CheckIndex):
            if not isinstance(statement.size, int) or statement.size < 0:
                raise fail(f"an index checked against a dimension of size {statement.size!r}",
                           statement)
            use(statement, statement.position)
            define(statement.target, statement)
        elif isinstance(statement, Load):
            buffer(statement, statement.buffer)
            use(statement, statement.offset)
            define(statement.target, statement)
        elif isinstance(statement, Store):
            buffer(statement, statement.buffer)
            use(statement, statement.offset, statement.operand)
        elif isinstance(statement, Accumulator):
            define(statement.name, statement)
        elif isinstance(statement, Accumulate):
            use(statement, statement.name, statement.operand)
        elif isinstance(statement, Gemm):
            buffer(statement, statement.a, statement.b, statement.c)
            use(statement, statement.alpha)
            row_blocks = -(-statement.m // max(statement.rows, 1))
            column_blocks = -(-statement.n // max(statement.columns, 1))
            if (statement.blocks != max(row_blocks * column_blocks, 1)
                    or min(row_blocks, column_blocks) > 1):
                raise fail("a gemm whose blocks are not of whole rows or whole columns of its "
                           "product", statement)
        elif isinstance(statement, AllReduce):
            buffer(statement, statement.source, statement.target)
            if statement.source == statement.target:
                raise fail("an all_reduce whose source is its target", statement)
        elif isinstance(statement, HostCall):
            buffer(statement, *statement.operands, *statement.results)
            if set(statement.operands) & set(statement.results):
                raise fail("a host call that writes a buffer it reads", statement)
        else:
            raise fail("not a loop IR statement", statement)
    scopes.pop()
