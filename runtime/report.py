"""The compile report: one HTML page per traced function (`f.report(path)`, `TRACER_REPORT=dir`).

For every compiled signature it shows the argument types and why the signature compiled, the
compile time of each stage, the pipeline stages side by side, the kernel graph (which values fuse
into which kernel, which reach memory) and, when compiled with TRACER_PROFILE=1, the time each
kernel ran. The graph is an SVG drawn by Graphviz `dot` when that program is installed; without
it the page shows the same graph as a table (and its dot source).
"""
from __future__ import annotations

import atexit
import datetime
import functools
import os
import shutil
import subprocess
import weakref
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from tracer.ir.fusion import FusedFunction
from tracer.runtime.pipeline import REPORT_STAGES

if TYPE_CHECKING:
    from tracer.runtime.entry import Entry
    from tracer.runtime.trace import TracedFunction

_LEAF_KINDS = {"I": "Python int (runtime input)", "F": "Python float (runtime input)"}


@functools.cache
def _environment():
    import jinja2  # here: a process that writes no report never imports it

    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(Path(__file__).parent / "templates")),
        autoescape=True, undefined=jinja2.StrictUndefined)


def type_text(shape, dtype: str) -> str:
    """'float32[3, 4]' for a shape and the dtype code ('<f4') a signature holds."""
    return f"{np.dtype(dtype).name}{list(shape)}"


def _leaf_text(signature: tuple) -> str:
    kind = signature[0]
    if kind in _LEAF_KINDS:
        return _LEAF_KINDS[kind]
    text = f"{'Tensor' if kind == 'T' else 'array'} {type_text(signature[1], signature[2])}"
    if kind == "T" and signature[3]:
        text += ", requires_grad"
    if kind == "T" and signature[4] is not None:
        text += f", .grad {type_text(*signature[4])}"
    return text


def kernel_graph(fused: FusedFunction) -> list[dict]:
    """Per kernel: what it reads from memory, what it computes without storing (fused into it)
    and what it writes to memory."""
    rows = []
    for number, kernel in enumerate(fused.kernels):
        results = {id(v) for v in kernel.results}
        inline = [f"%{v.name} = {i.primitive}" for i in kernel.instructions for v in i.outputs
                  if id(v) not in results]
        rows.append({"name": f"kernel_{number}", "kind": kernel.kind,
                     "reads": [f"%{v.name}: {v.type}" for v in kernel.inputs],
                     "fused": inline,
                     "writes": [f"%{v.name}: {v.type}" for v in kernel.results]})
    return rows


def dot_source(fused: FusedFunction) -> str:
    """The kernel graph in Graphviz's language: boxes are kernels (listing the values fused into
    them), ellipses are values in memory, edges are reads and writes."""
    function = fused.function
    outputs = {id(v) for v in function.outputs}
    lines = [f'digraph "{function.name}" {{', "  rankdir=TB;",
             '  node [fontname="monospace", fontsize=10];']
    memory: dict[int, str] = {}

    def value_node(value) -> str:
        if id(value) not in memory:
            memory[id(value)] = f"v{len(memory)}"
            style = ', style=bold' if id(value) in outputs else ""
            lines.append(f'  {memory[id(value)]} [shape=ellipse, label="%{value.name}\\n'
                         f'{value.type}"{style}];')
        return memory[id(value)]

    for parameter in function.parameters:
        value_node(parameter)
    for row, kernel in zip(kernel_graph(fused), fused.kernels):
        label = "\\l".join([f"{row['name']} ({row['kind']})", *row["fused"]]) + "\\l"
        lines.append(f'  {row["name"]} [shape=box, label="{label}"];')
        for value in kernel.inputs:
            lines.append(f"  {value_node(value)} -> {row['name']};")
        for value in kernel.results:
            lines.append(f"  {row['name']} -> {value_node(value)};")
    lines.append("}")
    return "\n".join(lines) + "\n"


def render_svg(dot: str) -> str | None:
    """The graph drawn by Graphviz, or None when `dot` is not installed (or fails)."""
    program = shutil.which("dot")
    if program is None:
        return None
    try:
        result = subprocess.run([program, "-Tsvg"], input=dot, capture_output=True, text=True,
                                timeout=60, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    svg = result.stdout
    return svg[svg.find("<svg"):] if "<svg" in svg else None


def _signature(key: tuple, entry: "Entry", number: int) -> dict:
    structure, leaves, grad_mode = key[:3]  # (a fourth element: see SignatureCache.lookup)
    executable = entry.executable
    fused = executable.fused
    dot = dot_source(fused)
    # the back-end stages are parts of "backend" (as measured when that code was compiled: a
    # signature whose optimized graph was compiled before reuses the code)
    timings = [(stage, 1e3 * seconds) for stage, seconds in entry.timings.items()]
    timings += [(f"backend: {stage}", 1e3 * seconds)
                for stage, seconds in executable.timings.items()]
    kernel_times = executable.kernel_times()
    total = sum(t.seconds for t in kernel_times) or 1.0
    return {
        "number": number,
        "reason": entry.reason or "first call",
        "grad_mode": grad_mode,
        "arguments": [(entry.leaf_names.get(i, f"leaf {i}"), _leaf_text(leaf))
                      for i, leaf in enumerate(leaves)],
        "timings": timings,
        "total_ms": 1e3 * sum(entry.timings.values()),
        "stages": [(stage, entry.stages[stage] if stage in entry.stages
                    else executable.stage_text(stage)) for stage in REPORT_STAGES],
        "kernels": kernel_graph(fused),
        "dot": dot,
        "svg": render_svg(dot),
        "profiled": executable.profiling,
        "kernel_times": [(t.kernel, t.calls, 1e3 * t.seconds,
                          1e6 * t.seconds / t.calls if t.calls else 0.0, 100 * t.seconds / total)
                         for t in kernel_times],
    }


def render_report(traced: "TracedFunction") -> str:
    """The HTML page of every signature `traced` has compiled."""
    signatures = [_signature(key, entry, number)
                  for number, (key, entry) in enumerate(list(traced._signatures.entries.items()))]
    return _environment().get_template("report.html.j2").render(
        name=traced._name, signatures=signatures, cache_info=traced.cache_info(),
        created=datetime.datetime.now().isoformat(timespec="seconds"))


def write_report(traced: "TracedFunction", path: str | os.PathLike) -> str:
    path = os.fspath(path)
    folder = os.path.dirname(path)
    if folder:
        os.makedirs(folder, exist_ok=True)
    with open(path, "w", encoding="utf-8") as file:
        file.write(render_report(traced))
    return path


# TRACER_REPORT=dir: pages written when a signature compiles, and again at exit so that they
# include the kernel times measured since (TRACER_PROFILE=1).
_reported: "weakref.WeakKeyDictionary[TracedFunction, str]" = weakref.WeakKeyDictionary()


def write_report_to(traced: "TracedFunction", folder: str) -> str:
    """Write `traced`'s page into `folder` as <function name>.html (another traced function of
    the same name gets <name>.<n>.html) and rewrite it at exit."""
    if traced not in _reported:
        taken = set(_reported.values())
        path = os.path.join(folder, f"{traced._name}.html")
        count = 1
        while path in taken:
            path = os.path.join(folder, f"{traced._name}.{count}.html")
            count += 1
        _reported[traced] = path
    return write_report(traced, _reported[traced])


@atexit.register
def _rewrite_reports() -> None:
    for traced, path in list(_reported.items()):
        try:
            write_report(traced, path)
        except OSError:
            pass  # the folder went away: nothing to update
