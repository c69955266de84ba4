"""The `tracer` logger and its children (tracer.trace, tracer.compile, tracer.cache), and
TRACER_LOG: a library only adds a handler when the user asked for one without writing code."""
from __future__ import annotations

import logging
import os
import sys
import warnings

LOGGER = logging.getLogger("tracer")
_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
           "error": logging.ERROR}


def configure_from_environment() -> None:
    """With TRACER_LOG=info|debug (also warning, error), log to stderr at that level."""
    setting = os.environ.get("TRACER_LOG", "").strip().lower()
    if not setting:
        return
    level = _LEVELS.get(setting)
    if level is None:
        warnings.warn(f"TRACER_LOG={setting!r} is not one of {', '.join(_LEVELS)}; not logging",
                      stacklevel=2)
        return
    if not any(getattr(h, "tracer_environment", False) for h in LOGGER.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(name)s %(levelname)s: %(message)s"))
        handler.tracer_environment = True  # marks the one handler this module owns
        LOGGER.addHandler(handler)
    LOGGER.setLevel(level)
