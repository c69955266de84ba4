"""The on-disk cache of compiled object code, shared across processes.

An entry's key hashes the LLVM IR text, the host (triple, CPU name, CPU features), the project
version, the cache format and whether the code is bounds-checked (TRACER_CHECK_BOUNDS; the checked
text differs anyway, but a checked and an unchecked object must never be confused); the file is named after the key. Each file holds a header (magic,
format version, the full key, payload length, SHA-256 of the payload) then the object code. A file
whose header, length or checksum does not match is treated as absent: the module is compiled again
and the entry rewritten, never run. Writes go to a temporary file in the same directory, then
`os.replace`, so readers never see a partial entry. The directory is created private (0700).

TRACER_CACHE_DIR sets the directory (default $XDG_CACHE_HOME/tracer or ~/.cache/tracer);
TRACER_DISABLE_CACHE=1 turns the disk cache off.
"""
from __future__ import annotations

import hashlib
import os
import struct
import tempfile
from importlib import metadata
from pathlib import Path

MAGIC = b"TRACEROBJ"
FORMAT = 1
_HEADER = struct.Struct("<9sI32sQ32s")  # magic, format, key, payload length, payload sha256


def project_version() -> str:
    try:
        return metadata.version("tracer")
    except metadata.PackageNotFoundError:
        return "unknown"


def cache_directory() -> Path | None:
    if os.environ.get("TRACER_DISABLE_CACHE") == "1":
        return None
    configured = os.environ.get("TRACER_CACHE_DIR")
    if configured:
        return Path(configured)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tracer"


def cache_key(llvm_ir: str, triple: str, cpu: str, features: str, checked: bool) -> bytes:
    digest = hashlib.sha256()
    for part in (f"format={FORMAT}", f"version={project_version()}", triple, cpu, features,
                 f"checked={int(checked)}", llvm_ir):
        digest.update(part.encode())
        digest.update(b"\0")
    return digest.digest()


class ObjectCache:
    """One entry of the disk cache: `load()` the object code if a valid entry exists, `store()` it."""

    def __init__(self, directory: Path, key: bytes):
        self.directory = directory
        self.key = key
        self.path = directory / f"{key.hex()}.o"

    def load(self) -> bytes | None:
        try:
            data = self.path.read_bytes()
        except OSError:
            return None
        if len(data) < _HEADER.size:
            return None
        magic, form, key, length, checksum = _HEADER.unpack_from(data)
        payload = data[_HEADER.size:]
        if (magic != MAGIC or form != FORMAT or key != self.key or length != len(payload)
                or hashlib.sha256(payload).digest() != checksum):
            return None
        return payload

    def store(self, payload: bytes) -> None:
        header = _HEADER.pack(MAGIC, FORMAT, self.key, len(payload),
                              hashlib.sha256(payload).digest())
        try:
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            descriptor, temporary = tempfile.mkstemp(dir=self.directory, prefix=".tmp-")
            try:
                with os.fdopen(descriptor, "wb") as file:
                    file.write(header + payload)
                os.replace(temporary, self.path)
            except BaseException:
                os.unlink(temporary)
                raise
        except OSError:
            pass  # a read-only or full disk only costs a recompilation next time
