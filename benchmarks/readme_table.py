"""The README's short benchmark table, made from benchmarks/results.md (the full table that
`make bench` writes), so the two never disagree.

    python -m benchmarks.readme_table      (from the repository root; `make bench` runs it)

Each row of results.md becomes: workload, size, the tracer's time, the fastest peer and the ratio;
the table replaces whatever stands between the README's `bench:start` and `bench:end` markers.
"""
from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
START, END = "<!-- bench:start -->", "<!-- bench:end -->"


def short_table(results: str) -> str:
    """The short table for the README from the text of results.md."""
    lines = [line for line in results.splitlines() if line.startswith("|")]
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    tracer, fastest = header.index("tracer"), header.index("tracer / fastest peer")
    out = ["| workload | size | tracer | tracer / fastest peer (below 1: tracer faster) |",
           "|---|---|---|---|"]
    for line in lines[2:]:
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        out.append(f"| {cells[0]} | {cells[1]} | {cells[tracer]} | {cells[fastest]} |")
    run = next((line[2:] for line in results.splitlines() if line.startswith("- ")), "")
    return "\n".join(out) + f"\n\n({run}.)"


def update(readme: Path = ROOT / "README.md", results: Path = ROOT / "benchmarks" / "results.md") -> None:
    """Rewrite the README's table between the markers from results.md."""
    text = readme.read_text()
    begin, end = text.index(START) + len(START), text.index(END)
    readme.write_text(text[:begin] + "\n" + short_table(results.read_text()) + "\n" + text[end:])


if __name__ == "__main__":
    update()
