"""The structure the code keeps: the tracer's modules import each other in one direction only
(no circle, no import hidden inside a function to break one), `ir/` imports nothing else of the
project, and `runtime/` reaches tensors only through tracer's interfaces (tracer/buffers.py and
Trace), never through Tensor's private members. Also the one place `.grad` accumulates:
backward() adds into the same `.grad` tensor, eagerly and compiled, as PyTorch does."""
import ast
import os
import re

import numpy as np
import pytest
import torch

import tracer as tr
from tracer.tensor import add_methods

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _sources(folder: str) -> dict[str, str]:
    """Module name (as imported: tracer.x, tracer.nn.y, tracer.ir.z) -> source text."""
    package = "tracer" if folder == "tracer" else f"tracer.{folder}"
    modules = {}
    for directory, _, files in os.walk(os.path.join(ROOT, folder)):
        for file in files:
            if file.endswith(".py"):
                path = os.path.join(directory, file)
                parts = os.path.relpath(path, os.path.join(ROOT, folder))[:-3].split(os.sep)
                name = ".".join([package, *parts]).removesuffix(".__init__")
                with open(path) as source:
                    modules[name] = source.read()
    return modules


def _imports(source: str, modules) -> list[tuple[str, bool]]:
    """(imported project module, whether the import is inside a function or class); `from
    package import name` imports the module package.name where `modules` has one."""
    found = []

    def visit(node, nested: bool):
        for child in ast.iter_child_nodes(node):
            inner = nested or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                 ast.ClassDef))
            if isinstance(child, ast.ImportFrom) and child.module and child.level == 0:
                found.extend((f"{child.module}.{alias.name}" if f"{child.module}.{alias.name}"
                              in modules else child.module, inner) for alias in child.names)
            elif isinstance(child, ast.Import):
                found.extend((alias.name, inner) for alias in child.names)
            visit(child, inner)
    visit(ast.parse(source), False)
    return [(module, inner) for module, inner in found
            if module == "tracer" or module.startswith("tracer.")]


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A circle of imports in `graph`, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def search(module: str) -> list[str] | None:
        state[module] = 1
        path.append(module)
        for target in sorted(graph.get(module, ())):
            if state.get(target) == 1:
                return path[path.index(target):] + [target]
            if target not in state and (found := search(target)):
                return found
        path.pop()
        state[module] = 2
        return None

    for module in sorted(graph):
        if module not in state and (found := search(module)):
            return found
    return None


def test_the_cycle_finder_finds_a_circle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_tracer_modules_import_each_other_one_way():
    modules = _sources("tracer")
    graph, hidden = {}, []
    for name, source in modules.items():
        imports = _imports(source, modules)
        graph[name] = {target for target, _ in imports if target in modules}
        # tracer/__init__.py imports tr.trace (runtime/) and tr.nn on first use, on purpose
        hidden += [f"{name} imports {target} inside a function" for target, nested in imports
                   if nested and name != "tracer"]
    assert not hidden, hidden
    assert _cycle(graph) is None, " -> ".join(_cycle(graph))
    # the tracer sits below the compiler: it imports ir/ but not runtime/ or codegen/
    upward = [(name, target) for name, source in modules.items() if name != "tracer"
              for target, _ in _imports(source, modules)
              if target.startswith(("tracer.runtime", "tracer.codegen"))]
    assert not upward, upward


def test_ir_imports_nothing_else_of_the_project():
    modules = _sources("ir")
    outside = [(name, target) for name, source in modules.items()
               for target, _ in _imports(source, modules)
               if not (target == "tracer.ir" or target.startswith("tracer.ir."))]
    assert not outside, outside


def test_runtime_reaches_no_private_member_of_a_tensor():
    private = sorted({name for name in dir(tr.Tensor)
                      if name.startswith("_") and not name.startswith("__")})
    assert "_handle" in private and "_make" in private  # the set is what it should be
    pattern = re.compile(r"\.(%s)\b" % "|".join(private))
    found = [f"{name}:{number}: {line.strip()}"
             for name, source in _sources("runtime").items()
             for number, line in enumerate(source.splitlines(), 1) if pattern.search(line)]
    assert not found, "\n".join(found)


def test_a_tensor_method_defined_twice_is_an_error_and_methods_are_named_as_tensors():
    class Clash:  # a group that would replace LayoutMethods.reshape
        def reshape(self):
            return self

    with pytest.raises(TypeError, match=r"Tensor.reshape is defined twice \(.*Clash\)"):
        add_methods(Clash)
    assert tr.Tensor.reshape is not Clash.reshape
    assert repr(tr.ones(1).reshape).startswith("<bound method Tensor.reshape of ")
    assert tr.Tensor.T.fget.__qualname__ == "Tensor.T"


def _accumulate_twice(x, g0):
    """Two backward() calls into a .grad set beforehand; returns the .grad."""
    x.grad = g0
    (x * x).sum().backward()
    (x * 3).sum().backward()
    return x.grad


def test_backward_accumulates_into_the_same_grad_tensor_as_pytorch():
    values = np.array([1.0, -2.0, 0.5], np.float32)
    expected_x = torch.tensor(values, requires_grad=True)
    torch_g0 = torch.ones(3)
    torch_grad = _accumulate_twice(expected_x, torch_g0)
    assert torch_grad is torch_g0  # PyTorch adds into the .grad tensor it has
    eager_x, eager_g0 = tr.tensor(values, requires_grad=True), tr.ones(3)
    assert _accumulate_twice(eager_x, eager_g0) is eager_g0
    np.testing.assert_allclose(eager_g0.numpy(), torch_grad.numpy(), rtol=1e-6)

    @tr.trace
    def step(x):
        (x * x).sum().backward()
        (x * 3).sum().backward()
        return x.grad * 1

    traced_x, traced_g0 = tr.tensor(values, requires_grad=True), tr.ones(3)
    traced_x.grad = traced_g0
    result = step(traced_x)
    assert traced_x.grad is traced_g0  # the compiled .grad is written back into the same tensor
    np.testing.assert_allclose(traced_g0.numpy(), torch_grad.numpy(), rtol=1e-6)
    np.testing.assert_allclose(result.numpy(), torch_grad.numpy(), rtol=1e-6)
