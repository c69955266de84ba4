"""Every ```python snippet in README.md and in each page of docs/ runs as written, in order, in one
namespace per page, as a reader pastes them into one session."""
import contextlib
import io
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
# docs/findings.md is left out: its snippets are abbreviated reproducers, each run in full as a test
# in tests/test_differential_findings.py.
PAGES = [ROOT / "README.md", *sorted(page for page in (ROOT / "docs").glob("*.md")
                                     if page.name != "findings.md")]


def snippets(page: pathlib.Path) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", page.read_text(), re.MULTILINE | re.DOTALL)


def test_readme_has_snippets():
    assert len(snippets(ROOT / "README.md")) >= 2


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_snippets_run_as_written(page, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a snippet that writes files writes them here
    namespace = {"__name__": "__readme__"}
    for number, snippet in enumerate(snippets(page), 1):
        output = io.StringIO()
        try:
            with contextlib.redirect_stdout(output):
                exec(compile(snippet, f"{page.name} snippet {number}", "exec"), namespace)
        except Exception as error:  # noqa: BLE001 - reported with the snippet that raised
            pytest.fail(f"{page.name} snippet {number} raised {error!r}:\n{snippet}")
