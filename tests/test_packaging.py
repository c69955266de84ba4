"""Only the name `tracer` is importable after install, and a user's own modules named like the
project's folders (runtime.py, ir.py, codegen.py) beside their script change nothing."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SCRIPT = """
import tracer as tr
step = tr.trace(lambda x: (x * 2).sum())
print(float(step(tr.ones(3)).item()), tr.__file__)
"""


def _run(directory, environment):
    return subprocess.run([sys.executable, "script.py"], cwd=directory, env=environment,
                          capture_output=True, text=True, timeout=120)


def _shadowed_directory(tmp_path):
    # The user's own modules with the folders' names, each of which fails when imported.
    for name in ("ir", "codegen", "runtime"):
        (tmp_path / f"{name}.py").write_text(f"raise ImportError('the user\\'s own {name}.py')\n")
    (tmp_path / "script.py").write_text(SCRIPT)
    return tmp_path


def test_installed_package_ignores_user_modules_with_the_folders_names(tmp_path):
    environment = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = _run(_shadowed_directory(tmp_path), environment)
    assert result.returncode == 0, result.stderr
    value, location = result.stdout.split("\n")[0].split()
    assert float(value) == 6.0


def test_checkout_on_pythonpath_resolves_the_same_names(tmp_path):
    environment = dict(os.environ, PYTHONPATH=ROOT)
    result = _run(_shadowed_directory(tmp_path), environment)
    assert result.returncode == 0, result.stderr
    value, location = result.stdout.split("\n")[0].split()
    assert float(value) == 6.0
    assert location == os.path.join(ROOT, "tracer", "__init__.py")


def test_only_tracer_is_installed(tmp_path):
    environment = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    (tmp_path / "script.py").write_text(
        "import importlib.util\n"
        "print([n for n in ('ir', 'codegen', 'runtime') if importlib.util.find_spec(n)])\n")
    result = _run(tmp_path, environment)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_version_and_public_names():
    import tracer as tr

    # The contract's names (../shared/DESIGN.md) are listed by dir(tr), including those imported on
    # first use, and each resolves; no internal module or private name is listed.
    names = dir(tr)
    for name in ("trace", "nn", "optim", "Function", "tensor", "grad", "value_and_grad", "gradcheck",
                 "no_grad", "where", "TracerError", "float32", "__version__"):
        assert name in names, name
    for name in names:
        getattr(tr, name)
    assert not [name for name in names if name.startswith("_") and name != "__version__"]
    assert "dispatch" not in names and "FUNCTIONS" not in names
    major, minor, patch = (int(part) for part in tr.__version__.split("."))
    assert (major, minor, patch) >= (0, 2, 0)
