"""The HTML compile report and TRACER_PROFILE's per-kernel times."""
import html.parser
import os
import re
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

import tracer as tr
from tracer.runtime.report import REPORT_STAGES

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Page(html.parser.HTMLParser):
    """The text of every element carrying a class or data-stage attribute we look for, and the
    tags seen (a real parse: unbalanced markup shows up as missing sections)."""

    def __init__(self):
        super().__init__()
        self.stack: list[tuple[str, str | None]] = []
        self.sections: dict[str, list[str]] = {}
        self.tags: list[str] = []

    def handle_starttag(self, tag, attrs):
        attributes = dict(attrs)
        key = attributes.get("data-stage") or attributes.get("class")
        self.tags.append(tag)
        if tag not in ("br", "meta", "img"):
            self.stack.append((tag, key))
            if key:
                self.sections.setdefault(key, []).append("")

    def handle_endtag(self, tag):
        while self.stack:
            open_tag, _ = self.stack.pop()
            if open_tag == tag:
                break

    def handle_data(self, data):
        for _, key in self.stack:
            if key:
                self.sections[key][-1] += data


class Square(tr.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return 2 * x * grad


def training_step(x, w, lr):
    loss = Square.apply(x.mm(w).tanh()).sum()
    loss.backward()
    with tr.no_grad():
        w.sub_(lr * w.grad)
        w.grad.zero_()
    return loss


def test_report_shows_every_section_with_real_content(tmp_path):
    step = tr.trace(training_step)
    x, w = tr.randn(8, 4), tr.randn(4, 3, requires_grad=True)
    step(x, w, 0.1)
    step(tr.randn(16, 4), w, 0.1)
    path = step.report(tmp_path / "step.html")
    page = Page()
    page.feed(open(path, encoding="utf-8").read())
    assert page.tags.count("html") == 1 and page.stack == []
    assert len(page.sections["signature"]) == 2
    arguments = page.sections["arguments"]
    assert "float32[8, 4]" in arguments[0] and "float32[16, 4]" in arguments[1]
    assert "requires_grad" in arguments[0] and "first call" in arguments[0]
    assert "shape of x: (8, 4) -> (16, 4)" in arguments[1]
    for stage in REPORT_STAGES:  # each stage shown is that signature's own text
        shown = page.sections[stage][1]
        assert shown.strip() and shown.endswith(step.ir(tr.randn(16, 4), w, 0.1, stage=stage))
    timings = page.sections["timings"][0]
    for stage in ("trace", "grad", "optimize", "backend", "backend: load", "total"):
        assert stage in timings
    graph = page.sections["kernel-graph"][0]
    fused = step.ir(x, w, 0.1, stage="fused")
    kernels = [line.split("= ")[1].split()[0] for line in fused.splitlines() if "= kernel_" in line]
    assert kernels and all(k in graph for k in kernels)
    assert "tanh" in graph and "digraph" in graph
    assert "TRACER_PROFILE=1" in page.sections["profile"][0]  # not profiled: says how to


def test_profile_counts_every_kernel_call(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACER_PROFILE", "1")
    step = tr.trace(training_step)
    x, w = tr.randn(64, 32), tr.randn(32, 16, requires_grad=True)
    step(x, w, 0.01)
    step(x, w, 0.01)  # w.grad exists from now on: the signature of the calls measured below
    executable = list(step._signatures.entries.values())[-1].executable
    before = executable.kernel_times()
    started = time.perf_counter()
    for _ in range(5):
        step(x, w, 0.01)
    elapsed = time.perf_counter() - started
    after = executable.kernel_times()
    assert [k.kernel for k in after] == [f"kernel_{i}" for i in range(len(after))]
    assert len(after) == step.ir(x, w, 0.01, stage="fused").count("= kernel_")
    assert all(a.calls - b.calls == 5 for a, b in zip(after, before))
    measured = sum(a.seconds - b.seconds for a, b in zip(after, before))
    assert 0 < measured < elapsed
    assert "clock_gettime" in executable.llvm_ir
    page = Page()
    page.feed(open(step.report(tmp_path / "r.html"), encoding="utf-8").read())
    profile = page.sections["profile"][0]
    assert "kernel_0" in profile and "µs per call" in profile


def test_profiling_is_part_of_the_compile_key(monkeypatch):
    @tr.trace
    def double(x):
        return x * 2

    double(tr.ones(3))
    plain = next(iter(double._signatures.entries.values())).executable
    assert plain.kernel_times() == [] and "clock_gettime" not in plain.llvm_ir
    monkeypatch.setenv("TRACER_PROFILE", "1")
    double.cache_clear()
    double(tr.ones(3))
    profiled = next(iter(double._signatures.entries.values())).executable
    assert profiled.compiled is not plain.compiled and profiled.kernel_times()[0].calls == 1
    np.testing.assert_array_equal(double(tr.ones(3)).numpy(), [2, 2, 2])


def test_tracer_report_environment_writes_pages_with_exit_profile(tmp_path):
    script = ("import tracer as tr\n"
              "f = tr.trace(lambda x: (x.exp() * 2).sum())\n"
              "for _ in range(3): f(tr.ones(100))\n")
    environment = dict(os.environ, PYTHONPATH=ROOT, TRACER_REPORT=str(tmp_path / "pages"),
                       TRACER_PROFILE="1", TRACER_DISABLE_CACHE="1")
    run = subprocess.run([sys.executable, "-c", script], env=environment, capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    page = Page()
    text = (tmp_path / "pages" / "<lambda>.html").read_text(encoding="utf-8")
    page.feed(text)
    assert "kernel_0" in page.sections["profile"][0]
    # rewritten at exit: the three calls measured
    assert re.search(r"<code>kernel_0</code></td>\s*<td class=\"number\">3</td>", text)


@pytest.mark.slow
def test_report_opens_in_headless_chromium(tmp_path):
    browser = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome")
                    if shutil.which(n)), None)
    if browser is None:
        pytest.skip("no Chromium installed")
    step = tr.trace(training_step)
    step(tr.randn(8, 4), tr.randn(4, 3, requires_grad=True), 0.1)
    path = step.report(tmp_path / "step.html")
    run = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom",
                          f"file://{path}"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    page = Page()
    page.feed(run.stdout)  # the DOM as the browser built it
    assert page.sections["signature"] and "kernel_0" in page.sections["kernel-graph"][0]


def test_graphviz_svg_when_dot_is_installed(tmp_path):
    if shutil.which("dot") is None:
        pytest.skip("Graphviz dot is not installed (the page then shows the graph as a table)")
    step = tr.trace(training_step)
    step(tr.randn(8, 4), tr.randn(4, 3, requires_grad=True), 0.1)
    text = open(step.report(tmp_path / "step.html"), encoding="utf-8").read()
    svg = text[text.index("<svg"):text.index("</svg>")]
    assert "kernel_0" in svg and "%x" in svg


FREED_STEP = """
import gc, os, sys, weakref
import tracer as tr

def train(calls):
    w = tr.ones(4)

    @tr.trace
    def step(x):
        return (x * w).exp().sum()

    for _ in range(calls):
        step(tr.ones(4))
    step(tr.ones(2, 4))  # a second signature
    for _ in range(2):
        step(tr.ones(4))  # after the page was last written
    return weakref.ref(step)

written = os.path.join(os.environ["TRACER_REPORT"], "step.html")
step = train(3)
gc.collect()
print(step() is None, open(written, encoding="utf-8").read().count('class="signature"'))
if sys.argv[1] == "skip exit":
    os._exit(0)  # the page as written when the signatures compiled, not rewritten at exit
"""


@pytest.mark.parametrize("at_exit", [True, False], ids=["rewritten at exit", "as compiled"])
def test_a_page_keeps_the_signatures_of_a_traced_function_freed_before_exit(tmp_path, at_exit):
    """A step traced inside train() is freed when train returns: the page written when each
    signature compiled shows it, and the rewrite at exit keeps both signatures (with the kernel
    times measured since, TRACER_PROFILE=1) instead of a page of 0 signatures."""
    environment = dict(os.environ, PYTHONPATH=ROOT, TRACER_REPORT=str(tmp_path),
                       TRACER_PROFILE="1", TRACER_DISABLE_CACHE="1")
    run = subprocess.run([sys.executable, "-c", FREED_STEP, "exit" if at_exit else "skip exit"],
                         env=environment, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["True", "2"]  # freed before exit; the page had both already
    text = (tmp_path / "step.html").read_text(encoding="utf-8")
    page = Page()
    page.feed(text)
    assert "2 compiled signature(s)" in text and len(page.sections["signature"]) == 2
    arguments = page.sections["arguments"]
    assert "float32[4]" in arguments[0] and "float32[2, 4]" in arguments[1]
    assert ("No longer in the cache" in text) == at_exit  # at exit, the function is gone
    # the first signature's kernels ran 3 times when the second compiled, 5 times by exit
    calls = re.findall(r"<code>kernel_0</code></td>\s*<td class=\"number\">(\d+)</td>", text)
    assert calls[0] == ("5" if at_exit else "3")


def timing_rows(text: str, table: str) -> dict[str, float]:
    """The (step, ms) rows of one table of a signature's compile-time section."""
    start = text.index('<section class="timings">')
    section = text[start:text.index("</section>", start)]
    if table == "later":
        later = section.find('<table class="later">')
        section = section[later:] if later >= 0 else ""
    else:
        section = section[:section.index("</table>")]
    return {stage: float(ms) for stage, ms in re.findall(
        r"<tr><td>([^<]+)</td><td class=\"number\">([0-9.]+)</td></tr>", section)}


def test_after_a_disk_cache_hit_the_compile_times_say_so_and_add_up(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACER_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("TRACER_DISABLE_CACHE", raising=False)

    # The same program on two lines: the second's code comes from the disk (the one in memory is
    # shared by the same text, lines included)
    compiled = tr.trace(lambda x: (x * 3.5).exp().sum(dim=1))
    loaded = tr.trace(lambda x: (x * 3.5).exp().sum(dim=1))
    x = tr.ones(4, 3)
    for traced in (compiled, loaded):
        traced(x)
    loaded.ir(x, stage="llvm")  # a hit's LLVM text is made now, after the compile
    pages = {name: open(traced.report(tmp_path / f"{name}.html"), encoding="utf-8").read()
             for name, traced in (("compiled", compiled), ("loaded", loaded))}
    assert "compiled by\nLLVM" in pages["compiled"]
    assert "loaded from the disk cache" not in pages["compiled"]
    assert "loaded from the disk cache" in pages["loaded"]
    for name, text in pages.items():
        rows = timing_rows(text, "timings")
        parts = {stage: ms for stage, ms in rows.items() if stage.startswith("backend: ")}
        later = timing_rows(text, "later")
        if name == "compiled":
            assert 0 < sum(parts.values()) <= rows["backend"], (name, rows)
            assert {"backend: fuse", "backend: rows", "backend: memory", "backend: schedule",
                    "backend: render", "backend: llvm", "backend: load"} <= parts.keys()
            assert later == {}
        else:  # found by its grad stage (runtime/warm_cache.py): neither optimized nor fused
            assert "optimize" not in rows and "backend" not in rows
            assert parts.keys() == {"backend: load (from the disk cache)"}
            assert 0 < sum(parts.values()) <= rows["warm"], (name, rows)
            # the report's stages made the rest of the back end, later
            assert {"fuse", "rows", "memory", "render"} <= later.keys() and later["render"] > 0
