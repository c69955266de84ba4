"""Errors raised to users, and how they find the user's source line."""
from __future__ import annotations

import inspect
import os
import sys
import warnings

# Frames from these folders are the project's own: an error names the first frame outside them.
_PROJECT_FOLDERS = tuple(
    os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), folder) + os.sep
    for folder in ("tracer", "ir", "runtime", "codegen"))


def project_file(filename: str) -> bool:
    """Whether `filename` is the project's own code."""
    return filename.startswith(_PROJECT_FOLDERS)


# The file names of the code objects met on the stack, each told apart once: project code (None)
# or the user's file's base name (every traced operation asks for its line).
_user_files: dict[str, str | None] = {}


def _user_file(filename: str) -> str | None:
    if filename not in _user_files:
        _user_files[filename] = None if project_file(filename) else os.path.basename(filename)
    return _user_files[filename]


def user_frame():
    """The innermost stack frame that belongs to user code, or None. (Every traced operation asks,
    from ~14 frames down: the table is read inline, a call per frame took 10% of tracing.)"""
    frame, files = sys._getframe(1), _user_files
    while frame is not None:
        filename = frame.f_code.co_filename
        if (files[filename] if filename in files else _user_file(filename)) is not None:
            return frame
        frame = frame.f_back
    return None


def user_line() -> str:
    """'file.py:12' for the user's line that is running now."""
    frame = user_frame()
    if frame is None:
        return "<unknown>"
    return f"{_user_file(frame.f_code.co_filename)}:{frame.f_lineno}"


def definition_line(function) -> str:
    """'file.py:12' for the line that defines `function` (a user's Function backward, say)."""
    try:
        code = inspect.unwrap(function).__code__
    except AttributeError:
        return "<unknown>"
    return f"{os.path.basename(code.co_filename)}:{code.co_firstlineno}"


def warn_at_user_line(message: str, category: type[Warning]) -> None:
    """`warnings.warn` attributed to the user's line that is running now (as `stacklevel` would,
    without counting the project's own frames)."""
    frame = user_frame()
    if frame is None:
        warnings.warn(message, category, stacklevel=2)
        return
    warnings.warn_explicit(message, category, frame.f_code.co_filename, frame.f_lineno,
                           module=frame.f_globals.get("__name__"),
                           registry=frame.f_globals.setdefault("__warningregistry__", {}))


class TracerError(Exception):
    """Base of every error this project raises about user code."""

    def __init__(self, message: str, line: str | None = None):
        self.line = user_line() if line is None else line
        super().__init__(f"{self.line}: {message}")


class ShapeMismatchError(TracerError, ValueError):
    """Operands whose shapes or dtypes do not fit the operation."""


class IndexOutOfRangeError(ShapeMismatchError, IndexError):
    """An index outside its dimension: eagerly, or found by the check compiled code always makes
    before it reads or writes at a computed index."""


class TracingError(TracerError):
    """Something a traced function may not do: data-dependent control flow, reading values."""


class SpecializationNeeded(TracingError):
    """The Python value of a traced tensor is needed (a size, an index, a branch): if it comes
    from int arguments alone, `@trace` traces again with them static."""

    def __init__(self, message: str, value, what: str):
        super().__init__(message)
        self.message, self.value, self.what = message, value, what  # value: an ir.Value


class HostValuesNeeded(SpecializationNeeded):
    """A custom Function's forward or backward read the values of a traced tensor (`.numpy()`):
    under `@trace` it then runs as a host callback (tracer/host_function.py)."""


class HostCallbackError(TracerError):
    """A custom Function that runs on the host (NumPy, SciPy) under `@trace` returned results of
    other shapes or dtypes than when it was traced, or cannot be differentiated again."""


class InplaceError(TracerError):
    """An in-place change that would invalidate a gradient."""


class FunctionBackwardError(TracerError):
    """A custom Function's backward returned something that does not fit its inputs."""


class ArgumentError(TracerError, TypeError):
    """An argument of a type the operation does not accept."""


class GradcheckError(TracerError):
    """gradcheck found an analytic gradient that disagrees with finite differences."""


class BoundsError(TracerError):
    """Bounds-checked compiled code (TRACER_CHECK_BOUNDS=1) caught an access outside a buffer."""


class SettingError(TracerError, ValueError):
    """An environment setting (TRACER_...) with a value the runtime cannot use."""


class TracerWarning(UserWarning):
    """Base of every warning this project emits about user code."""


class RecompileWarning(TracerWarning):
    """A traced function compiled new signatures too often in a short time (see
    runtime/recompiles.py): it names what changed and what to do instead."""


class CacheLimitWarning(TracerWarning):
    """A traced function compiled more signatures than TRACER_CACHE_LIMIT keeps."""
