"""The warm path: `import tracer` loads no compiler back end, a disk-cache hit runs the object code
without generating LLVM text (so without jinja2) or importing LLVM (llvmlite), the key is computed from the program before any
LLVM text exists, and a changed compiler never loads an object an older one wrote."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import tracer as tr
from tracer import ir
from tracer.ir import schedule
from tracer.ir.types import TensorType
from tracer.runtime import cache, jit
from tracer.runtime.compiled import CompiledFunction
from tracer.runtime.pipeline import compile_graph

ROOT = Path(__file__).resolve().parent.parent

# A training step: a gradient, an in-place update of the argument and of its .grad, two results.
STEP = textwrap.dedent("""
    import gc, json, sys
    import numpy as np
    import tracer as tr

    @tr.trace
    def step(x, rate):
        loss = (x * 2 + 1).pow(2).sum()
        loss.backward()
        with tr.no_grad():
            x.sub_(rate * x.grad)
        return loss, x.grad * 1

    from tracer.runtime import native
    from tracer.runtime.compiled import CompiledFunction
    x = tr.tensor(np.linspace(-1, 1, 16, dtype=np.float32), requires_grad=True)
    loss, grad = step(x, 0.25)
    # whether each compiled signature scheduled its loop IR and generated its LLVM text
    generated = [[name in vars(o.back_end) for name in ("loops", "code")]
                 for o in gc.get_objects() if isinstance(o, CompiledFunction)]
    # what only compiling needs: the scheduler and loop IR, the renderer, the compile worker, LLVM
    compiling = [name for name in ("tracer.ir.loops", "tracer.ir.schedule",
                                   "tracer.codegen.render_kernel", "tracer.runtime.compile_worker",
                                   "subprocess", "tracer.runtime.jit", "llvmlite")
                 if name in sys.modules]
    # what a step that reaches no Module and no argparse Namespace needs from neither
    unneeded = [name for name in ("tracer.nn", "argparse") if name in sys.modules]
    print(json.dumps(dict(native.STATISTICS, loss=float(loss.item()), grad=grad.numpy().tolist(),
                          x=x.detach().numpy().tolist(), jinja2="jinja2" in sys.modules,
                          generated=generated, compiling=compiling, unneeded=unneeded)))
""")


def run_step(cache_directory: Path, path: Path = ROOT) -> dict:
    environment = dict(os.environ, TRACER_CACHE_DIR=str(cache_directory), PYTHONPATH=str(path),
                       OPENBLAS_NUM_THREADS="1")
    environment.pop("TRACER_DISABLE_CACHE", None)
    # run in `path`: `python -c` puts the working directory first on sys.path
    output = subprocess.run([sys.executable, "-c", STEP], env=environment, cwd=path, check=True,
                            capture_output=True, text=True, timeout=120).stdout
    return json.loads(output.strip().splitlines()[-1])


def expected_step() -> dict:
    """The step by hand, in float64: d/dx sum((2x+1)^2) = 4(2x+1)."""
    x = np.linspace(-1, 1, 16, dtype=np.float32).astype(np.float64)
    grad = 4 * (2 * x + 1)
    return dict(loss=float(((2 * x + 1) ** 2).sum()), grad=grad, x=x - 0.25 * grad)


def assert_step_correct(result: dict) -> None:
    expected = expected_step()
    np.testing.assert_allclose(result["loss"], expected["loss"], rtol=1e-6)
    np.testing.assert_allclose(result["grad"], expected["grad"], rtol=1e-6)
    np.testing.assert_allclose(result["x"], expected["x"], rtol=1e-6, atol=1e-6)


def test_import_tracer_loads_neither_llvmlite_nor_jinja2():
    script = ("import sys, tracer\n"
              "print(sorted(m for m in sys.modules if m.split('.')[0] in "
              "('llvmlite', 'jinja2')))")
    output = subprocess.run([sys.executable, "-c", script], env=dict(os.environ,
                            PYTHONPATH=str(ROOT)), check=True, capture_output=True, text=True)
    assert output.stdout.strip() == "[]"


def test_a_disk_hit_generates_no_llvm_text_and_imports_no_jinja2(tmp_path):
    first = run_step(tmp_path)
    assert (first["compiled"], first["disk_hits"]) == (1, 0)
    assert first["jinja2"] and first["generated"] == [[True, True]]
    assert first["unneeded"] == []  # (importing tr.nn took ~15 ms of a fresh process's tr.trace)
    assert {"tracer.codegen.render_kernel", "llvmlite"} <= set(first["compiling"])
    assert_step_correct(first)
    second = run_step(tmp_path)
    assert (second["compiled"], second["disk_hits"]) == (0, 1)
    assert not second["jinja2"] and second["generated"] == [[False, False]]
    assert second["compiling"] == []  # none imported: the hit only loads (runtime/loader.py)
    assert second == dict(first, compiled=0, disk_hits=1, kernels_compiled=0, jinja2=False,
                          generated=[[False, False]], compiling=[])


def test_a_changed_compiler_does_not_load_the_object_an_older_one_wrote(tmp_path):
    """A copy of the project, run from its checkout: changing only a template (a Jinja comment,
    which changes no generated text) changes the compiler's fingerprint, so the entry the older
    compiler wrote is not used."""
    copy = tmp_path / "project"
    for folder in ("tracer", "ir", "codegen", "runtime"):
        shutil.copytree(ROOT / folder, copy / folder,
                        ignore=shutil.ignore_patterns("__pycache__"))
    cache_directory = tmp_path / "cache"
    assert run_step(cache_directory, copy)["compiled"] == 1
    assert run_step(cache_directory, copy)["disk_hits"] == 1
    entries = len(list(cache_directory.glob("*.o")))  # the program's and its kernels'
    with open(copy / "codegen" / "templates" / "loops.ll.j2", "a") as template:
        template.write("{# changed #}\n")
    changed = run_step(cache_directory, copy)
    assert (changed["compiled"], changed["disk_hits"], changed["kernel_hits"]) == (1, 0, 0)
    assert_step_correct(changed)
    assert len(list(cache_directory.glob("*.o"))) == 2 * entries  # none of them reused


def test_a_same_size_edit_of_the_compiler_is_seen_by_its_modification_time(tmp_path):
    """The compiler's fingerprint is remembered under the sources' sizes and modification times:
    an edit that keeps a template's size, with a new modification time, is a new compiler."""
    copy = tmp_path / "project"
    for folder in ("tracer", "ir", "codegen", "runtime"):
        shutil.copytree(ROOT / folder, copy / folder,
                        ignore=shutil.ignore_patterns("__pycache__"))
    template = copy / "codegen" / "templates" / "loops.ll.j2"
    template.write_text(template.read_text() + "{# a #}\n")
    cache_directory = tmp_path / "cache"
    assert run_step(cache_directory, copy)["compiled"] == 1
    assert run_step(cache_directory, copy)["disk_hits"] == 1
    status = template.stat()
    template.write_text(template.read_text()[:-len("{# a #}\n")] + "{# b #}\n")
    assert template.stat().st_size == status.st_size
    os.utime(template, ns=(status.st_atime_ns, status.st_mtime_ns + 1_000_000))
    changed = run_step(cache_directory, copy)
    assert (changed["compiled"], changed["disk_hits"], changed["kernel_hits"]) == (1, 0, 0)
    assert_step_correct(changed)


def test_the_compiler_fingerprint_is_hashed_once_then_remembered(tmp_path, monkeypatch):
    """A process whose disk cache remembers the fingerprint of these sources does not read
    them; the remembered value is the sources' hash; another stamp hashes them again."""
    monkeypatch.setenv("TRACER_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("TRACER_DISABLE_CACHE", raising=False)
    hashed = []
    original = cache.source_fingerprint
    monkeypatch.setattr(cache, "source_fingerprint",
                        lambda directories: hashed.append(1) or original(directories))
    compute = cache.compiler_fingerprint.__wrapped__  # (the process's value is cached)
    import tracer.codegen
    directories = [package.__path__[0] for package in (tracer.ir, tracer.codegen, tracer.runtime)]
    expected = original(directories)
    assert compute() == expected and len(hashed) == 1
    assert compute() == expected and len(hashed) == 1  # remembered
    # in an entry of its own kind: the object entries are only the programs' and kernels'
    assert len(list(tmp_path.glob("*.fingerprint"))) == 1 and not list(tmp_path.glob("*.o"))
    monkeypatch.setattr(cache, "source_stamp", lambda directories: b"another checkout")
    assert compute() == expected and len(hashed) == 2
    monkeypatch.setenv("TRACER_DISABLE_CACHE", "1")
    assert compute() == expected and len(hashed) == 3  # nowhere to remember it


def test_source_stamp_follows_names_sizes_and_modification_times(tmp_path):
    folder = tmp_path / "runtime"
    folder.mkdir()
    source = folder / "jit.py"
    source.write_text("x = 1\n")
    stamps = [cache.source_stamp([str(folder)])]
    (folder / "notes.txt").write_text("not a source")
    stamps.append(cache.source_stamp([str(folder)]))
    status = source.stat()
    os.utime(source, ns=(status.st_atime_ns, status.st_mtime_ns + 1))
    stamps.append(cache.source_stamp([str(folder)]))
    source.write_text("x = 22\n")
    os.utime(source, ns=(status.st_atime_ns, status.st_mtime_ns + 1))
    stamps.append(cache.source_stamp([str(folder)]))
    source.rename(folder / "kernels.py")
    stamps.append(cache.source_stamp([str(folder)]))
    assert stamps[0] == stamps[1]
    assert len(set(stamps[1:])) == 4


def test_source_fingerprint_covers_names_and_contents(tmp_path):
    folder = tmp_path / "codegen"
    (folder / "templates").mkdir(parents=True)
    (folder / "render.py").write_text("x = 1\n")
    (folder / "templates" / "loops.ll.j2").write_text("{{ x }}\n")
    fingerprints = [cache.source_fingerprint([str(folder)])]
    (folder / "notes.txt").write_text("not a source")  # neither Python nor a template
    fingerprints.append(cache.source_fingerprint([str(folder)]))
    (folder / "templates" / "loops.ll.j2").write_text("{{ y }}\n")
    fingerprints.append(cache.source_fingerprint([str(folder)]))
    (folder / "render.py").rename(folder / "lowering.py")
    fingerprints.append(cache.source_fingerprint([str(folder)]))
    assert fingerprints[0] == fingerprints[1]
    assert len(set(fingerprints[1:])) == 3


def test_source_fingerprint_is_the_same_for_a_copy_elsewhere(tmp_path):
    """Names are relative to the package's folder: a checkout copied elsewhere, or a package
    installed, computes the same fingerprint (and the same objects hit the disk cache)."""
    fingerprints = []
    for place in ("checkout", "site-packages/deep"):
        folder = tmp_path / place / "ir"
        (folder / "passes").mkdir(parents=True)
        (folder / "graph.py").write_text("x = 1\n")
        (folder / "passes" / "dce.py").write_text("y = 2\n")
        fingerprints.append(cache.source_fingerprint([str(folder)]))
    (folder / "passes" / "dce.py").rename(folder / "dce.py")  # the same contents, moved
    fingerprints.append(cache.source_fingerprint([str(folder)]))
    assert fingerprints[0] == fingerprints[1] != fingerprints[2]


def scale(n: int = 100) -> ir.Graph:
    f = ir.Graph("scale")
    x = f.add_parameter("x", TensorType((n,), "f32"))
    b = ir.GraphBuilder(f)
    f.outputs = [b.add(b.mul(x, 2.0), 1.0)]
    return ir.optimize(f)


def compiled_twice(function: ir.Graph) -> tuple[CompiledFunction, CompiledFunction]:
    """A miss, then a hit of the same function (two objects: no sharing in memory)."""
    before = dict(jit.STATISTICS)
    miss = compile_graph(function)
    hit = compile_graph(function)
    assert jit.STATISTICS["compiled"] - before["compiled"] == 1
    assert jit.STATISTICS["disk_hits"] - before["disk_hits"] == 1
    return miss, hit


def test_a_hit_gives_the_same_stages_and_results_as_the_miss(fresh_cache):
    miss, hit = compiled_twice(scale())
    # neither the loop IR nor the LLVM text was needed to run it
    not_made = {"loops", "_module"}.isdisjoint
    assert not_made(vars(hit.back_end))
    x = np.arange(100, dtype=np.float32)
    np.testing.assert_array_equal(hit([x])[0], 2 * x + 1)
    assert not_made(vars(hit.back_end))
    for stage in ("fused", "loops", "llvm"):
        assert hit.stage_text(stage) == miss.stage_text(stage)
    assert hit.llvm_ir == miss.llvm_ir


def test_a_bounds_failure_in_code_from_the_disk_names_the_same_access(fresh_cache, monkeypatch):
    """The table of checked accesses is made again when a hit's check fails (fault injection: the
    loop runs three elements past the end, as in test_codegen_bounds.py)."""
    monkeypatch.setenv("TRACER_CHECK_BOUNDS", "1")
    split_extent = schedule.split_extent
    monkeypatch.setattr(schedule, "split_extent", lambda kernel, flat: split_extent(kernel, flat)
                        + (3 if kernel.kind == "loop" else 0))
    miss, hit = compiled_twice(scale())
    messages = []
    for compiled in (miss, hit):
        with pytest.raises(tr.BoundsError) as caught:
            compiled([np.arange(100, dtype=np.float32)])
        messages.append(str(caught.value))
    assert "read of element 100 of %x (f32[100], parameter 0)" in messages[0]
    assert messages[0] == messages[1]


def located(location: str) -> ir.Graph:
    function = scale()
    for instruction in function.instructions:
        instruction.location = location
    return function


def test_code_that_moved_in_the_users_file_hits_and_names_its_new_line(fresh_cache, monkeypatch):
    """The user's lines are not part of the disk key (they change no object code); the message of
    a failed bounds check in code from the disk names the line of the program that loaded it."""
    monkeypatch.setenv("TRACER_CHECK_BOUNDS", "1")
    split_extent = schedule.split_extent
    monkeypatch.setattr(schedule, "split_extent", lambda kernel, flat: split_extent(kernel, flat)
                        + (3 if kernel.kind == "loop" else 0))
    before = dict(jit.STATISTICS)
    first = compile_graph(located("step.py:10"))
    moved = compile_graph(located("step.py:12"))
    assert jit.STATISTICS["compiled"] - before["compiled"] == 1
    assert jit.STATISTICS["disk_hits"] - before["disk_hits"] == 1
    assert moved.disk_key == first.disk_key
    for compiled, line in ((first, "step.py:10"), (moved, "step.py:12")):
        with pytest.raises(tr.BoundsError) as caught:
            compiled([np.arange(100, dtype=np.float32)])
        assert caught.value.line == line
