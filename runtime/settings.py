"""Reading the numeric settings of the runtime from the environment, with errors that say which
setting is wrong and what it accepts."""
from __future__ import annotations

import os
import re

from tracer.errors import SettingError

_UNITS = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}


def byte_size_setting(name: str, default: int) -> int:
    """A size in bytes from environment variable `name`: a whole number, optionally followed by
    K, M, G or T (binary multiples, an optional "iB" or "B" after it), e.g. 512M or 2GiB."""
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    match = re.fullmatch(r"(\d+)\s*([kmgt]?)(?:i?b)?", text, re.IGNORECASE)
    if match is None:
        raise SettingError(f"{name}={text!r} is not a size: use bytes, or a number followed by "
                           f"K, M, G or T (e.g. {name}=512M)")
    return int(match.group(1)) * _UNITS[match.group(2).lower()]


def count_setting(name: str, default: int) -> int:
    """A positive whole number from environment variable `name`."""
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    if not text.isdigit() or int(text) < 1:
        raise SettingError(f"{name}={text!r} is not a positive whole number")
    return int(text)
