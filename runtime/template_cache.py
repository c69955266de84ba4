"""The code generator's Jinja2 templates compiled once per user, not once per process: their
compiled Python code is kept in the disk cache (runtime/cache.py: HMAC-checked entries, trusted
directories only, evicted with the rest), keyed by each template's name and source. Compiling them
took 120-225 ms of every process that generated code (math.ll.j2 alone over half of it); a process
whose cache already holds them loads them instead.

`install()` hands the cache to codegen/template_environment.py; it must run before the first
template is loaded (the runtime calls it where it first generates code)."""
from __future__ import annotations

import hashlib

import jinja2

from tracer.codegen import template_environment
from tracer.runtime.cache import TEMPLATE_SUFFIX, ObjectCache, open_entry


class TemplateCode(jinja2.BytecodeCache):
    """A template's compiled code in the disk cache; Jinja2 checks the code's own header (its
    format and Python's version) and the source's checksum before using it."""

    def load_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
        entry = _entry(bucket)
        code = entry.load() if entry is not None else None
        if code is not None:
            bucket.bytecode_from_string(code)

    def dump_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
        entry = _entry(bucket)
        if entry is not None:
            entry.store(bucket.bytecode_to_string())


def _entry(bucket: jinja2.bccache.Bucket) -> ObjectCache | None:
    key = hashlib.sha256(f"template\0{bucket.key}\0{bucket.checksum}".encode()).digest()
    return open_entry(key, TEMPLATE_SUFFIX)


def install() -> None:
    """Keep the templates' compiled code in the disk cache from now on (once per process)."""
    if template_environment.bytecode_cache is None:
        template_environment.bytecode_cache = TemplateCode()
