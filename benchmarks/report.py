"""The results as a markdown table (medians, and the ratios tracer / fastest peer and
tracer / floor) and as a chart."""
from __future__ import annotations

import math
from pathlib import Path

from benchmarks.harness import PEERS, Row


def duration(seconds: float) -> str:
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if seconds >= scale or unit == "µs":
            value = seconds / scale
            return f"{value:.3g} {unit}" if value < 100 else f"{value:.0f} {unit}"
    raise AssertionError("unreachable")


def fastest_peer(row: Row) -> tuple[str, float] | None:
    others = {peer: seconds for peer, seconds in row.seconds.items() if peer != "tracer"}
    return min(others.items(), key=lambda item: item[1]) if others else None


def fastest_floor(row: Row) -> tuple[str, float] | None:
    return min(row.floors.items(), key=lambda item: item[1]) if row.floors else None


def ratio(tracer: float | None, other: tuple[str, float] | None) -> str:
    if tracer is None or other is None:
        return "—"
    return f"{tracer / other[1]:.2f}× ({other[0]})"


def table(rows: list[Row], notes: list[str]) -> str:
    """Markdown: one line per workload and size; failing programs are marked and their errors
    listed under the table."""
    header = ["workload", "size", *PEERS, "floor", "tracer / fastest peer", "tracer / floor"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    failures: list[str] = []
    for row in rows:
        cells = [row.workload, row.size]
        for peer in PEERS:
            if peer in row.failures:
                failures.append(f"{row.workload}, {row.size}, {peer}: {row.failures[peer]}")
                cells.append(f"**FAIL** [{len(failures)}]")
            else:
                cells.append(duration(row.seconds[peer]) if peer in row.seconds else "—")
        floors = "; ".join(f"{duration(seconds)} ({name})" for name, seconds in row.floors.items())
        cells += [floors or "—", ratio(row.seconds.get("tracer"), fastest_peer(row)),
                  ratio(row.seconds.get("tracer"), fastest_floor(row))]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", *(f"- {note}" for note in notes)]
    if failures:
        lines += ["", "Failures:", ""] + [f"{i}. {text}" for i, text in enumerate(failures, 1)]
    return "\n".join(lines) + "\n"


def chart(rows: list[Row], title: str, path: Path) -> None:
    """Each row's times relative to the tracer's (log scale; left of 1 is faster than the
    tracer), one bar per peer and the fastest floor."""
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib import pyplot

    shown = [row for row in rows if "tracer" in row.seconds]
    series = [*PEERS[1:], "floor"]
    figure, axes = pyplot.subplots(figsize=(10, 0.6 * len(shown) * len(series) / 3 + 2))
    height = 0.8 / len(series)
    for index, name in enumerate(series):
        positions, values = [], []
        for position, row in enumerate(shown):
            seconds = (fastest_floor(row) or (None, None))[1] if name == "floor" \
                else row.seconds.get(name)
            if seconds is not None:
                positions.append(position + index * height)
                values.append(seconds / row.seconds["tracer"])
        axes.barh(positions, values, height=height, label=name,
                  color="black" if name == "floor" else None)
    axes.axvline(1.0, color="red", linewidth=1, label="tracer")
    axes.set_xscale("log")
    axes.set_yticks([p + 0.4 - height / 2 for p in range(len(shown))])
    axes.set_yticklabels([f"{row.workload}\n{row.size}" for row in shown], fontsize=7)
    axes.invert_yaxis()
    axes.set_xlabel("time / tracer's time (log scale; left of 1: faster than the tracer)")
    low = min(min(b.get_width() for b in axes.patches), 0.5)
    high = max(max(b.get_width() for b in axes.patches), 2.0)
    axes.set_xlim(low / 1.5, high * 1.5 if math.isfinite(high) else 10)
    axes.legend(fontsize=7, loc="lower right")
    axes.set_title(title, fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
