"""The code generator's Jinja2 templates compiled once, not once per process: like Python's own
bytecode, their compiled code is kept beside them (in codegen/templates/__pycache__, or under
PYTHONPYCACHEPREFIX, and not written where PYTHONDONTWRITEBYTECODE says not to), so that a fresh
disk cache no longer means compiling them again; where that folder cannot be written, in the disk
cache (runtime/cache.py: HMAC-checked entries, trusted directories only, evicted with the rest),
keyed by each template's name and source. Compiling them took 120-225 ms of every process that
generated code (math.ll.j2 alone over half of it).

Jinja2 checks the code's own header (its format and Python's version) and the source's checksum
before using it from either place; a stale or damaged file is compiled again and replaced.

`install()` hands the cache to codegen/template_environment.py; it must run before the first
template is loaded (the runtime calls it where it first generates code)."""
from __future__ import annotations

import hashlib
import os
import sys
import tempfile

import jinja2

from tracer.codegen import template_environment
from tracer.runtime.cache import TEMPLATE_SUFFIX, ObjectCache, open_entry

_TEMPLATES = os.path.join(os.path.dirname(os.path.abspath(template_environment.__file__)),
                          "templates")


class TemplateCode(jinja2.BytecodeCache):
    """A template's compiled code beside the templates, else in the disk cache."""

    def load_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
        for code in (_read_beside(bucket), _read_entry(bucket)):
            if code is not None:
                bucket.bytecode_from_string(code)  # (left empty if stale or damaged)
                if bucket.code is not None:
                    return

    def dump_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
        code = bucket.bytecode_to_string()
        if not _write_beside(bucket, code):
            entry = _entry(bucket)
            if entry is not None:
                entry.store(code)


def _folder() -> str:
    """Where Python keeps the bytecode of a module in the templates' folder."""
    if sys.pycache_prefix:
        return os.path.join(sys.pycache_prefix, os.path.relpath(_TEMPLATES, os.path.sep))
    return os.path.join(_TEMPLATES, "__pycache__")


def _path(bucket: jinja2.bccache.Bucket) -> str:
    return os.path.join(_folder(), f"{bucket.key}.jinja2")


def _read_beside(bucket: jinja2.bccache.Bucket) -> bytes | None:
    try:
        with open(_path(bucket), "rb") as file:
            return file.read()
    except OSError:
        return None


def _write_beside(bucket: jinja2.bccache.Bucket, code: bytes) -> bool:
    """Whether `code` was written beside the templates (atomically: a concurrent reader sees the
    old file or the new one)."""
    if sys.dont_write_bytecode:
        return False
    try:
        os.makedirs(_folder(), exist_ok=True)
        descriptor, temporary = tempfile.mkstemp(dir=_folder(), suffix=".partial")
        try:
            with os.fdopen(descriptor, "wb") as file:
                file.write(code)
            os.replace(temporary, _path(bucket))
        except BaseException:
            os.unlink(temporary)
            raise
    except OSError:
        return False
    return True


def _entry(bucket: jinja2.bccache.Bucket) -> ObjectCache | None:
    key = hashlib.sha256(f"template\0{bucket.key}\0{bucket.checksum}".encode()).digest()
    return open_entry(key, TEMPLATE_SUFFIX)


def _read_entry(bucket: jinja2.bccache.Bucket) -> bytes | None:
    entry = _entry(bucket)
    return entry.load() if entry is not None else None


def install() -> None:
    """Keep the templates' compiled code from now on (once per process)."""
    if template_environment.bytecode_cache is None:
        template_environment.bytecode_cache = TemplateCode()


def compile_all() -> int:
    """Compile every template now and keep its code (as `python -m compileall` does for
    modules); how many there are. The benchmarks' fresh processes find them compiled, as an
    installed package's are."""
    install()
    return len(template_environment.compile_all())
