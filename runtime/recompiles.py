"""Recompile storms, visible by default: a traced function that compiles more than
TRACER_RECOMPILE_WARNING (default 4) new signatures within a minute -- each recompile costs a
trace and an LLVM compile, seconds for a real model -- gives one `tr.RecompileWarning` that names
what changed, by the path the user wrote (`model.blocks[0].attn.qkv.weight`,
`opt.param_groups[0]['lr']`), and what to do instead. (`TRACER_LOG=info` logs every recompile.)
"""
from __future__ import annotations

import time
from collections import Counter, deque

from tracer.runtime.settings import count_setting

WINDOW_SECONDS = 60.0
DEFAULT_WARNING = 4

# (what a reason says, the advice for it), first match wins: see `advice`
_ADVICE = (
    (".grad of", "the traced step reads the .grad it is called with (backward() adds to it, or "
                 "the code tests `.grad is None`): call optimizer.zero_grad() (set_to_none=True, "
                 "the default) at the start of the traced step, before backward()"),
    ("branched on whether", "the traced code branches in Python on a float it reads from "
                            "outside (`if x > 0:`): each outcome compiles once; use tr.where(...) "
                            "to compute both sides if the outcome keeps changing"),
    (": rebound", "a tensor the function reads from outside was replaced by a new one: update "
                  "it in place instead (`x.copy_(new)`, `x[...] = ...`, or an optimizer's step)"),
    ("shape of", "each new shape compiles again: keep shapes fixed (drop or pad the last "
                 "batch, pad sequences to a few lengths)"),
    ("static value of", "static arguments compile once per value: pass numbers that change as "
                        "ordinary arguments (Python floats, or 0-d tensors), not static ones"),
    ("dtype of", "keep the dtypes of the inputs the same from call to call"),
    ("requires_grad of", "keep requires_grad of the inputs the same from call to call"),
    (" -> ", "a value the function reads from outside is compiled in: a Python float is read on "
             "every call, but an int, a numpy scalar, a string, or a float whose Python value the "
             "trace needs (int(x), a size) is not; pass it as an argument or keep it a Python "
             "float the trace only computes with"),
)


def advice(reason: str) -> str:
    for marker, text in _ADVICE:
        if marker in reason:
            return text
    return "see TRACER_LOG=info for every recompile and its reason"


class RecompileMonitor:
    """The recompiles of one traced function: `note` each one's reason; it returns the warning
    to give when they come too fast (once per function)."""

    def __init__(self, name: str):
        self.name = name
        self._times: deque[float] = deque()
        self._causes: Counter[str] = Counter()  # "what changed" -> how often
        self._latest: dict[str, str] = {}  # "what changed" -> its latest reason
        self._warned = False

    def clear(self) -> None:
        self._times.clear()
        self._causes.clear()
        self._latest.clear()
        self._warned = False

    def note(self, reason: str) -> str:
        now = time.monotonic()
        self._times.append(now)
        while self._times and now - self._times[0] > WINDOW_SECONDS:
            self._times.popleft()
        for phrase in reason.split("; "):  # "what: before -> after", counted by what
            what = phrase.split(": ")[0]
            self._causes[what] += 1
            self._latest[what] = phrase
        limit = count_setting("TRACER_RECOMPILE_WARNING", DEFAULT_WARNING)
        if self._warned or len(self._times) <= limit:
            return ""
        self._warned = True
        causes = [(self._latest[what], count) for what, count in self._causes.most_common(3)]
        changed = "; ".join(f"{cause} ({count} times, the latest shown)" if count > 1 else cause
                            for cause, count in causes)
        tips = list(dict.fromkeys(advice(cause) for cause, _ in causes))
        return (f"{self.name} compiled {len(self._times)} new signatures in "
                f"{now - self._times[0]:.1f} s (more than TRACER_RECOMPILE_WARNING={limit} in "
                f"{WINDOW_SECONDS:.0f} s); each one traces and compiles again. What changed: "
                f"{changed}. To compile once: {' Also: '.join(tips)}.")
