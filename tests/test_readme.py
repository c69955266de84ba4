"""Every ```python snippet in README.md runs as written, in order, in one namespace, as a reader
pastes them into one session."""
import contextlib
import io
import pathlib
import re

import pytest

README = pathlib.Path(__file__).resolve().parent.parent / "README.md"
SNIPPETS = re.findall(r"^```python\n(.*?)^```", README.read_text(), re.MULTILINE | re.DOTALL)


def test_readme_has_snippets():
    assert len(SNIPPETS) >= 2


def test_readme_snippets_run_as_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a snippet that writes files writes them here
    namespace = {"__name__": "__readme__"}
    for number, snippet in enumerate(SNIPPETS, 1):
        output = io.StringIO()
        try:
            with contextlib.redirect_stdout(output):
                exec(compile(snippet, f"README.md snippet {number}", "exec"), namespace)
        except Exception as error:  # noqa: BLE001 - reported with the snippet that raised
            pytest.fail(f"README snippet {number} raised {error!r}:\n{snippet}")
