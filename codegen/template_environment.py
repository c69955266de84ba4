"""The Jinja2 templates of codegen/templates/, loaded and compiled on first use (once per process):
importing the code generator costs nothing until it generates code, and a disk-cache hit, which
generates none, never imports jinja2."""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from tracer.codegen.lowering import double_hex
from tracer.codegen.two_over_pi import reduction_table


# Where the templates' compiled Python code is kept between processes: a jinja2.BytecodeCache that
# the runtime sets (runtime/template_cache.py) before the first template is loaded, or None.
bytecode_cache: Any = None


@functools.cache
def _environment():
    import jinja2  # here, on first use: see the module docstring

    environment = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(Path(__file__).parent / "templates")),
        undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
        bytecode_cache=bytecode_cache,
        # The templates are the package's, not edited while it runs: with reloading on, each of
        # a program's ~300 renders checked its file's time on disk.
        auto_reload=False)
    environment.filters["d"] = double_hex
    environment.globals["reduction_table"] = reduction_table  # math.ll.j2's bits of 2/pi
    return environment


def compile_all() -> list[str]:
    """Compile (or load the compiled code of) every template now; their names."""
    folder = Path(__file__).parent / "templates"
    names = sorted(path.name for path in folder.glob("*.j2"))
    for name in names:
        _environment().get_template(name)
    return names


def render(template: str, /, **context: Any) -> str:
    """`template` (e.g. "module.ll.j2") rendered with `context`."""
    return _environment().get_template(template).render(**context)


@functools.cache
def macros(name: str) -> Any:
    """The macros of template `name` as callables (`macros("loops.ll.j2").kernel(...)`)."""
    return _environment().get_template(name).module
