"""The printed form of the loop IR (ir/loops.py): the `loops` stage a user dumps, one statement a
line, each with the user's line it computes for in a column of its own."""
from __future__ import annotations

from tracer.ir.loops import (Accumulate, Accumulator, AllReduce, CheckIndex, Compute, Gemm, HostCall,
                             IndexOp, Load, Loop, LoopKernel, LoopProgram, Operand, Statement, Store)
from tracer.ir.types import SHORT_NAMES


def format_operand(operand: Operand) -> str:
    if isinstance(operand, bool):
        return "true" if operand else "false"
    return str(operand)


def _comment(text: str, line: str) -> str:
    """`text` and, in a column of its own, the user's line it computes for."""
    return f"{text:<54}  # {line}" if line else text


def _statement_lines(statement: Statement, indent: str) -> list[str]:
    def operands(values) -> str:
        return ", ".join(map(format_operand, values))

    if isinstance(statement, Loop):
        lines = [f"{indent}for {statement.counter} in [{statement.begin}, {statement.end}):"]
        for inner in statement.body:
            lines += _statement_lines(inner, indent + "  ")
        return lines
    if isinstance(statement, Compute):
        # (a cast's dtype attribute is the type printed)
        attributes = "".join(f" {{{k}={v}}}" for k, v in statement.attributes.items()
                             if k != "dtype")
        text = (f"{statement.target} : {SHORT_NAMES[statement.dtype]} = {statement.primitive} "
                f"{operands(statement.operands)}{attributes}")
        return [_comment(indent + text, statement.line)]
    if isinstance(statement, IndexOp):
        return [f"{indent}{statement.target} : index = {statement.op} "
                f"{operands(statement.operands)}"]
    if isinstance(statement, CheckIndex):
        text = (f"{statement.target} : index = checked_index {format_operand(statement.position)}, "
                f"{statement.size} {{dimension {statement.axis}, %{statement.operand.name}"
                f"{'' if statement.wrap else ', negative refused'}}}")
        return [_comment(indent + text, statement.line)]
    if isinstance(statement, Load):
        text = (f"{statement.target} : {SHORT_NAMES[statement.value.dtype]} = load "
                f"{statement.buffer}[{format_operand(statement.offset)}]")
        return [_comment(indent + text, statement.line)]
    if isinstance(statement, Store):
        text = (f"store {statement.buffer}[{format_operand(statement.offset)}] = "
                f"{format_operand(statement.operand)}")
        return [_comment(indent + text, statement.line)]
    if isinstance(statement, Accumulator):
        return [f"{indent}{statement.name} : {SHORT_NAMES[statement.dtype]} = accumulator "
                f"{format_operand(statement.initial)}"]
    if isinstance(statement, Accumulate):
        return [f"{indent}{statement.name} = {statement.primitive} {statement.name}, "
                f"{format_operand(statement.operand)}"]
    if isinstance(statement, Gemm):
        a = statement.a + ("^T" if statement.transpose_a else "")
        b = statement.b + ("^T" if statement.transpose_b else "")
        shape = f"[{statement.m}x{statement.k}] @ [{statement.k}x{statement.n}]"
        if statement.accumulate:
            text = (f"gemm {statement.c}[batch] += {format_operand(statement.alpha)} * "
                    f"{a}[batch] @ {b}[batch] {shape}")
        else:
            text = f"gemm {statement.c}[batch] = {a}[batch] @ {b}[batch] {shape}"
        if statement.blocks == 1:
            return [f"{indent}for batch in [begin, end):",
                    _comment(f"{indent}  {text}", statement.line)]
        axis, length = (("rows", statement.rows) if statement.rows < statement.m
                        else ("columns", statement.columns))
        return [f"{indent}for task in [begin, end): batch = task / {statement.blocks}, {axis} "
                f"[task % {statement.blocks} * {length}, +{length}) of c",
                _comment(f"{indent}  {text}", statement.line)]
    if isinstance(statement, AllReduce):
        text = (f"all_reduce {statement.target}[0:{statement.count}] = {statement.op} over processes "
                f"of {statement.source}[0:{statement.count}] : {SHORT_NAMES[statement.dtype]}")
        return [_comment(indent + text, statement.line)]
    if isinstance(statement, HostCall):
        text = (f"{', '.join(statement.results)} = host_call {statement.callback!r}"
                f"({', '.join(statement.operands)})")
        return [_comment(indent + text, statement.line)]
    raise TypeError(f"not a loop IR statement: {statement!r}")


def format_kernel(kernel: LoopKernel) -> str:
    parallel = (f", {kernel.chunks} chunks, {kernel.threads} threads" if kernel.threads > 1
                else "")
    chunks = f" (chunks of {kernel.rows} rows)" if kernel.kind == "rows" else ""
    lines = [f"  {kernel.name} {kernel.kind}, range [0, {kernel.extent}){chunks}{parallel}:"]
    lines += [f"    {buffer}" for buffer in kernel.buffers]
    for statement in kernel.body:
        lines += _statement_lines(statement, "    ")
    return "\n".join(lines)


def format_program(program: LoopProgram) -> str:
    """The `loops` stage: each kernel's buffers, then its loop nest."""
    parameters = ", ".join(f"%{p.name}: {p.type}" for p in program.parameters)
    lines = [f"def {program.name}({parameters}):  # arena {program.arena_size} bytes"]
    lines += [format_kernel(kernel) for kernel in program.kernels]
    returns = ", ".join(f"{location.kind} {location.index}" for location in program.returns)
    lines.append(f"  return {returns}")
    return "\n".join(lines) + "\n"
