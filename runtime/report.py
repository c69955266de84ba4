"""The compile report: one HTML page per traced function (`f.report(path)`, `TRACER_REPORT=dir`).

For every compiled signature it shows the argument types and why the signature compiled, the
compile time of each stage, the pipeline stages side by side, the kernel graph (which values fuse
into which kernel, which reach memory) and, when compiled with TRACER_PROFILE=1, the time each
kernel ran. The graph is an SVG drawn by Graphviz `dot` when that program is installed; without
it the page shows the same graph as a table (and its dot source).

A TRACER_REPORT page keeps every signature its function compiled: one evicted from the cache, or
whose function was freed before exit, stays as last written. The compile times say whether the
machine code came from the disk cache, and list apart the steps a hit made later, when asked for.
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
    from tracer.runtime.traced_function import TracedFunction

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


def _signature(leaves: tuple, grad_mode: bool, entry: "Entry", number: int) -> dict:
    executable = entry.executable
    fused = executable.fused
    dot = dot_source(fused)
    # The back end's steps while compiling are parts of "backend" (as measured when that code was
    # compiled: a signature whose optimized graph was compiled before reuses the code). After a
    # disk-cache hit, the loop IR and the LLVM text are made later, only when asked for (a stage
    # text, this page): those steps are listed apart, not as parts of "backend".
    timings = [(stage, 1e3 * seconds) for stage, seconds in entry.timings.items()]
    timings += [(f"backend: {stage}" + (" (from the disk cache)"
                                        if stage == "load" and executable.from_disk_cache else ""),
                 1e3 * executable.timings[stage]) for stage in executable.compile_steps]
    return {
        "number": number,
        "reason": entry.reason or "first call",
        "grad_mode": grad_mode,
        "arguments": [(entry.leaf_names.get(i, f"leaf {i}"), _leaf_text(leaf))
                      for i, leaf in enumerate(leaves)],
        "from_disk_cache": executable.from_disk_cache,
        "timings": timings,
        "total_ms": 1e3 * sum(entry.timings.values()),
        "stages": [(stage, entry.stages[stage] if stage in entry.stages
                    else executable.stage_text(stage)) for stage in REPORT_STAGES],
        "later": [(stage, 1e3 * seconds) for stage, seconds in executable.timings.items()
                  if stage not in executable.compile_steps],
        "kernels": kernel_graph(fused),
        "dot": dot,
        "svg": render_svg(dot),
        "profiled": executable.profiling,
        "kernel_times": _kernel_times(executable),
        "cached": True,
    }


def _kernel_times(executable) -> list[tuple]:
    kernel_times = executable.kernel_times()
    total = sum(t.seconds for t in kernel_times) or 1.0
    return [(t.kernel, t.calls, 1e3 * t.seconds, 1e6 * t.seconds / t.calls if t.calls else 0.0,
             100 * t.seconds / total) for t in kernel_times]


def _render(name: str, signatures: list[dict], cache_info) -> str:
    return _environment().get_template("report.html.j2").render(
        name=name, signatures=signatures, cache_info=cache_info,
        created=datetime.datetime.now().isoformat(timespec="seconds"))


def render_report(traced: "TracedFunction") -> str:
    """The HTML page of every signature `traced` has in its cache."""
    signatures = [_signature(key[1], key[2], entry, number)
                  for number, (key, entry) in enumerate(list(traced._signatures.entries.items()))]
    return _render(traced._name, signatures, traced.cache_info())


def _write(path: str, text: str) -> str:
    folder = os.path.dirname(path)
    if folder:
        os.makedirs(folder, exist_ok=True)
    with open(path, "w", encoding="utf-8") as file:
        file.write(text)
    return path


def write_report(traced: "TracedFunction", path: str | os.PathLike) -> str:
    return _write(os.fspath(path), render_report(traced))


class _Shown:
    """A signature on a TRACER_REPORT page, as last rendered: it stays on the page after its
    entry leaves the cache (evicted, cleared, or its traced function freed, as a step traced
    inside `train()` is at exit). With TRACER_PROFILE=1 its code is kept until exit, for the
    kernel times measured since."""

    def __init__(self, key: tuple, entry: "Entry"):
        self.leaves, self.grad_mode = key[1], key[2]  # (the structure may hold a model: not kept)
        self.entry = weakref.ref(entry)
        self.executable = entry.executable if entry.executable.profiling else None
        self.signature: dict = {}

    def render(self, number: int, cached: bool) -> dict:
        entry = self.entry()
        if entry is not None:
            self.signature = _signature(self.leaves, self.grad_mode, entry, number)
        elif self.executable is not None:
            self.signature["kernel_times"] = _kernel_times(self.executable)
        self.signature["cached"] = cached
        return self.signature


class _Page:
    """The page TRACER_REPORT writes for one traced function: every signature it compiled."""

    def __init__(self, traced: "TracedFunction", path: str):
        self.traced = weakref.ref(traced)
        self.name, self.path = traced._name, path
        self.shown: list[_Shown] = []
        self.cache_info = traced.cache_info()

    def write(self) -> str:
        traced = self.traced()
        cached = []
        if traced is not None:
            cached = list(traced._signatures.entries.items())
            self.cache_info = traced.cache_info()
            for key, entry in cached:
                if not any(shown.entry() is entry for shown in self.shown):
                    self.shown.append(_Shown(key, entry))
        current = {id(entry) for _, entry in cached}
        signatures = [shown.render(number, id(shown.entry()) in current)
                      for number, shown in enumerate(self.shown)]
        return _write(self.path, _render(self.name, signatures, self.cache_info))


# TRACER_REPORT=dir: pages written when a signature compiles, and again at exit so that they
# include the kernel times measured since (TRACER_PROFILE=1).
_pages: "weakref.WeakKeyDictionary[TracedFunction, _Page]" = weakref.WeakKeyDictionary()
_all_pages: list[_Page] = []  # kept after their traced function is freed


def write_report_to(traced: "TracedFunction", folder: str) -> str:
    """Write `traced`'s page into `folder` as <function name>.html (another traced function of
    the same name gets <name>.<n>.html) and rewrite it at exit."""
    page = _pages.get(traced)
    if page is None:
        taken = {page.path for page in _all_pages}
        path = os.path.join(folder, f"{traced._name}.html")
        count = 1
        while path in taken:
            path = os.path.join(folder, f"{traced._name}.{count}.html")
            count += 1
        page = _pages[traced] = _Page(traced, path)
        _all_pages.append(page)
    return page.write()


@atexit.register
def _rewrite_reports() -> None:
    for page in _all_pages:
        try:
            page.write()
        except OSError:
            pass  # the folder went away: nothing to update
