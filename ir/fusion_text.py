"""The `fused` stage printed: the optimized listing with its instructions grouped into kernels
(ir/fusion.py, ir/rows.py), not renamed, so that it diffs against `optimized`."""
from __future__ import annotations

from tracer.ir.fusion import FusedFunction, Kernel
from tracer.ir.text import format_instruction


def _kernel_header(kernel: Kernel) -> str:
    header = kernel.kind
    if kernel.update is not None:
        update = kernel.update
        alpha = "*".join(f"%{v.name}" for v in update.factors) or "1"
        header += f" accumulate(alpha={'-' if update.sign < 0 else ''}{alpha}, beta=1)"
    if kernel.kind == "rows":
        header += f"[{','.join(map(str, kernel.rows))}] in {kernel.chunks} chunks"
        kept = ", ".join(f"%{value.name}" for value, _ in kernel.kept)
        return header + (f" keeping rows of {kept}" if kept else "")
    if kernel.kind == "combine":
        return header + f" of {kernel.chunks} chunks"
    if kernel.kind != "matmul":
        header += f"[{','.join(map(str, kernel.shape))}]"
    return header


def _kernel_body(kernel: Kernel, indent: str) -> list[str]:
    """A kernel's instructions; a row kernel's by part (the first result names the part)."""
    if kernel.kind == "combine":
        return [f"{indent}%{value.name} = {value.producer.primitive} over %{partial.name}"
                for value, partial in kernel.partials]
    if kernel.kind == "rows":
        lines = []
        for part in kernel.parts:
            names = ", ".join(f"%{v.name}" for v in part.results)
            lines.append(f"{indent}{names} = part {_kernel_header(part)} {{")
            lines += _kernel_body(part, indent + "  ")
            lines.append(f"{indent}}}")
        return lines
    lines = [indent + format_instruction(instruction) for instruction in kernel.instructions]
    lines += [f"{indent}copy %{result.name}" for result in kernel.results
              if result.producer is None]
    return lines


def format_fused(fused: FusedFunction) -> str:
    """The `fused` stage: the optimized listing with its instructions grouped into kernels."""
    function = fused.function
    parameters = ", ".join(f"%{p.name}: {p.type}" for p in function.parameters)
    lines = [f"def {function.name}({parameters}):"]
    for number, kernel in enumerate(fused.kernels):
        names = ", ".join(f"%{v.name}" for v in kernel.results)
        types = ", ".join(str(v.type) for v in kernel.results)
        reads = ", ".join(f"%{v.name}" for v in kernel.inputs)
        lines.append(f"  {names} : {types} = kernel_{number} {_kernel_header(kernel)}({reads}) {{")
        lines += _kernel_body(kernel, "    ")
        lines.append("  }")
    lines.append("  return " + ", ".join(f"%{v.name}" for v in function.outputs))
    return "\n".join(lines) + "\n"
