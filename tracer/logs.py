"""The `tracer` logger and its children (tracer.trace, tracer.compile, tracer.cache), and
TRACER_LOG: a library only adds a handler when the user asked for one without writing code.
(`import tracer` imports the logging module only then: the compiler's modules, which log, import
it when they are first used.)"""
from __future__ import annotations

import os
import sys
import warnings

_LEVELS = ("debug", "info", "warning", "error")


def configure_from_environment() -> None:
    """With TRACER_LOG=info|debug (also warning, error), log to stderr at that level."""
    setting = os.environ.get("TRACER_LOG", "").strip().lower()
    if not setting:
        return
    if setting not in _LEVELS:
        warnings.warn(f"TRACER_LOG={setting!r} is not one of {', '.join(_LEVELS)}; not logging",
                      stacklevel=2)
        return
    import logging  # here, only when asked for: see the module docstring

    logger = logging.getLogger("tracer")
    if not any(getattr(h, "tracer_environment", False) for h in logger.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(name)s %(levelname)s: %(message)s"))
        handler.tracer_environment = True  # marks the one handler this module owns
        logger.addHandler(handler)
    logger.setLevel(getattr(logging, setting.upper()))
