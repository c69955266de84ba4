"""The on-disk cache of compiled object code, shared across this user's processes.

An entry's key hashes the program (the optimized IR text without the user's lines, and the
settings that shape its code, so the key is known before any LLVM text is generated: a hit neither
renders nor parses LLVM IR), the compiler itself (`compiler_fingerprint`: a hash of the sources and
templates of `tracer.ir`, `tracer.codegen` and `tracer.runtime`, so a changed compiler never loads
an object an older one wrote, also when running from a checkout; itself remembered in an entry
keyed by the sources' paths, sizes and modification times), the host (triple, CPU name, CPU
features, LLVM version), the cache format and whether the code is bounds-checked
(TRACER_CHECK_BOUNDS: a checked and an unchecked object must never be confused); the file is named
after the key. Each file holds a header (magic, format version, the full key, payload length,
HMAC-SHA256 of all of these and the payload) then the object code. The HMAC's secret is 32 random
bytes in the file `secret` of the cache directory, created 0600 by the first process that needs
it, so only this user's processes can write an entry that is ever run: an entry whose header,
length or HMAC does not match (corrupt, stale, or object code from anywhere else, re-labelled) is
treated as absent, compiled again and rewritten.

What is not trusted, and then only the in-memory cache is used (the reason is logged on the
`tracer.cache` logger): a directory not owned by this user or writable by others, and a secret
that is not a regular file owned by this user with mode 0600. Entries are opened without following
symlinks and without blocking, and read only if they are regular files of at most
MAX_ENTRY_BYTES (64 MiB); anything else (a FIFO, a device, a symlink) is treated as absent.

Writes go to a temporary file in the same directory, then `os.replace`, so readers never see a
partial entry. A hit touches the entry's modification time; a store that takes the directory's
entries past TRACER_CACHE_SIZE (default 1 GiB) deletes the least recently used entries until they
take seven eighths of it. Finding them stats every entry (2.9 s for the 255,000 entries of a full
1 GiB), so the size is kept in the file `stored` (LEDGER_NAME): each store adds its entry's bytes
under an exclusive flock, a count sets it, and a store counts only where it goes past the size or
is absent or unreadable (a directory filled by an older version: once). Entries deleted by hand
make it count early; stores made while another process counts may be missed until the next count.

TRACER_CACHE_DIR sets the directory (default $XDG_CACHE_HOME/tracer or ~/.cache/tracer);
TRACER_DISABLE_CACHE=1 turns the disk cache off.
"""
from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import hmac
import logging
import os
import stat
import struct
from collections.abc import Iterator

from tracer.runtime.settings import byte_size_setting

MAGIC = b"TRACEROBJ"
FORMAT = 4  # 4: a program's entry holds its objects (pack_objects)
_HEADER = struct.Struct("<9sI32sQ32s")  # magic, format, key, payload length, HMAC-SHA256
MAX_ENTRY_BYTES = 64 * 2**20
DEFAULT_CACHE_SIZE = 2**30
SECRET_NAME = "secret"
LEDGER_NAME = "stored"  # the bytes the entries take (see the module's docstring)
_LEDGER = struct.Struct("<q")
_SECRET_BYTES = 32
# Entries holding object code, those remembering the compiler's fingerprint (see
# `compiler_fingerprint`) and warm ones (runtime/warm_cache.py): evicted alike, told apart by name.
OBJECT_SUFFIX, FINGERPRINT_SUFFIX, TEMPLATE_SUFFIX, WARM_SUFFIX = ".o", ".fingerprint", ".template", ".warm"
HOST_SUFFIX = ".host"  # the host as LLVM sees it, remembered (runtime/native.host)
HOOK_SUFFIX = ".hook"  # the runtime's profile hook's object code (runtime/profile_hook.py)
SUFFIXES = (OBJECT_SUFFIX, FINGERPRINT_SUFFIX, TEMPLATE_SUFFIX, HOST_SUFFIX, HOOK_SUFFIX, WARM_SUFFIX)
_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC

log = logging.getLogger("tracer.cache")
_reported: set[tuple[str, str]] = set()  # (directory, reason) already logged by this process


def _sources(directories: list[str]) -> list[tuple[str, str]]:
    """(the folder holding its package, path) of the Python sources and templates under
    `directories`, in a fixed order."""
    sources = []
    for directory in directories:
        parent = os.path.dirname(directory)
        for root, subdirectories, files in os.walk(directory):
            subdirectories[:] = sorted(d for d in subdirectories if d != "__pycache__")
            for name in sorted(files):
                if name.endswith((".py", ".j2")):
                    sources.append((parent, os.path.join(root, name)))
    return sources


def source_fingerprint(directories: list[str]) -> str:
    """SHA-256 of the Python sources and templates under `directories` (names relative to their
    package's folder, and contents)."""
    digest = hashlib.sha256()
    for parent, path in _sources(directories):
        digest.update(os.path.relpath(path, parent).encode())
        with open(path, "rb") as file:
            digest.update(b"\0" + file.read() + b"\0")
    return digest.hexdigest()


def source_stamp(directories: list[str]) -> bytes:
    """SHA-256 of the path, size and modification time (ns) of each source under `directories`:
    what changes when a source is edited, as Python's own check of its cached bytecode sees it
    (which compares the seconds of the time and the size), without reading the sources."""
    digest = hashlib.sha256()
    for _, path in _sources(directories):
        status = os.stat(path)
        digest.update(f"{path}\0{status.st_size}\0{status.st_mtime_ns}\0".encode())
    return digest.digest()


@functools.cache
def compiler_fingerprint() -> str:
    """The fingerprint of the compiler this process runs: what turns a program into object code
    (the IR, the code generator and its templates, the runtime). Computed once per process, and
    remembered in the disk cache under the sources' `source_stamp`: reading and hashing the
    ~0.5 MB of sources took ~4 ms of every fresh process's first call, stat-ing them ~0.6 ms."""
    import tracer.codegen
    import tracer.ir
    import tracer.runtime
    directories = [package.__path__[0] for package in (tracer.ir, tracer.codegen, tracer.runtime)]
    digest = hashlib.sha256(f"format={FORMAT}\0compiler fingerprint\0".encode())
    digest.update(source_stamp(directories))
    remembered = open_entry(digest.digest(), FINGERPRINT_SUFFIX)
    fingerprint = remembered.load() if remembered is not None else None
    if fingerprint is not None:
        return fingerprint.decode()
    fingerprint = source_fingerprint(directories).encode()
    if remembered is not None:
        remembered.store(fingerprint)
    return fingerprint.decode()


def cache_directory() -> str | None:
    """The configured directory (trusted or not: see `open_entry`), or None if disabled."""
    if os.environ.get("TRACER_DISABLE_CACHE") == "1":
        return None
    configured = os.environ.get("TRACER_CACHE_DIR")
    if configured:
        return configured
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "tracer")


def cache_key(program: str, triple: str, cpu: str, features: str, checked: bool,
              llvm_version: str = "") -> bytes:
    """The key of `program` (the optimized IR text and the code-generation settings) compiled by
    this compiler, on LLVM `llvm_version`, for this host."""
    digest = hashlib.sha256()
    for part in (f"format={FORMAT}", f"compiler={compiler_fingerprint()}", f"llvm={llvm_version}",
                 triple, cpu, features, f"checked={int(checked)}", program):
        digest.update(part.encode())
        digest.update(b"\0")
    return digest.digest()


_COUNT = struct.Struct("<I")
_LENGTH = struct.Struct("<Q")


def pack_objects(objects: list[bytes]) -> bytes:
    """Several object codes as one entry's payload: their count, their lengths, then each."""
    lengths = b"".join(_LENGTH.pack(len(code)) for code in objects)
    return _COUNT.pack(len(objects)) + lengths + b"".join(objects)


def unpack_objects(payload: bytes) -> list[bytes] | None:
    """The object codes `pack_objects` packed, or None if `payload` is not such a packing."""
    if len(payload) < _COUNT.size:
        return None
    (number,) = _COUNT.unpack_from(payload)
    position = _COUNT.size + number * _LENGTH.size
    if position > len(payload):
        return None
    objects = []
    for index in range(number):
        (length,) = _LENGTH.unpack_from(payload, _COUNT.size + index * _LENGTH.size)
        objects.append(payload[position:position + length])
        position += length
    return objects if position == len(payload) else None


def _refuse(directory: str, reason: str) -> None:
    """Log, once per directory and reason, why the disk cache is not used."""
    if (str(directory), reason) not in _reported:
        _reported.add((str(directory), reason))
        log.warning("not using the disk cache %s: %s; compiled code is cached in memory only",
                    directory, reason)


def _untrusted(status: os.stat_result, what: str, private_mode: int | None) -> str | None:
    """Why a file or directory with this status is not trusted, or None if it is."""
    if status.st_uid != os.geteuid():
        return f"{what} is owned by uid {status.st_uid}, not by this user (uid {os.geteuid()})"
    if private_mode is not None and stat.S_IMODE(status.st_mode) != private_mode:
        return f"{what} has mode {stat.S_IMODE(status.st_mode):o}, expected {private_mode:o}"
    if status.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"{what} is writable by other users (mode {stat.S_IMODE(status.st_mode):o})"
    return None


def _trusted_directory(directory: str) -> bool:
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        status = os.stat(directory)
    except OSError as error:
        _refuse(directory, f"cannot create it ({error.strerror})")
        return False
    reason = (None if stat.S_ISDIR(status.st_mode) else "it is not a directory") or _untrusted(
        status, "the directory", None)
    if reason:
        _refuse(directory, reason)
        return False
    return True


def _read_secret(path: str) -> bytes | str:
    """The secret in `path`, or why it is not trusted (FileNotFoundError if there is none)."""
    descriptor = os.open(path, _OPEN_FLAGS)
    try:
        status = os.fstat(descriptor)
        if not stat.S_ISREG(status.st_mode):
            return "the secret is not a regular file"
        reason = _untrusted(status, "the secret", 0o600)
        if reason:
            return reason
        secret = os.read(descriptor, _SECRET_BYTES + 1)
    finally:
        os.close(descriptor)
    return secret if len(secret) == _SECRET_BYTES else "the secret has the wrong length"


def _create_secret(directory: str) -> None:
    """Write a new secret under a temporary name, then link it into place: two processes racing
    here agree on one secret (the loser's link fails and it reads the winner's), and nobody reads
    a partly written one."""
    temporary = os.path.join(directory, f".tmp-secret-{os.getpid()}-{os.urandom(8).hex()}")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                         | os.O_CLOEXEC, 0o600)
    try:
        os.fchmod(descriptor, 0o600)  # whatever the umask
        os.write(descriptor, os.urandom(_SECRET_BYTES))
        os.close(descriptor)
        descriptor = -1
        try:
            os.link(temporary, os.path.join(directory, SECRET_NAME))
        except FileExistsError:
            pass
    finally:
        if descriptor >= 0:
            os.close(descriptor)
        os.unlink(temporary)


def _secret(directory: str) -> bytes | None:
    path = os.path.join(directory, SECRET_NAME)
    try:
        try:
            secret = _read_secret(path)
        except FileNotFoundError:
            _create_secret(directory)
            secret = _read_secret(path)
    except OSError as error:
        secret = ("the secret is a symlink" if error.errno == errno.ELOOP
                  else f"cannot read or create the secret ({error.strerror})")
    if isinstance(secret, str):
        _refuse(directory, f"{secret} ({path})")
        return None
    return secret


def open_entry(key: bytes, suffix: str = OBJECT_SUFFIX) -> ObjectCache | None:
    """The disk-cache entry for `key` (a file named after it, ending in `suffix`), or None if the
    disk cache is disabled or not trusted."""
    directory = cache_directory()
    capacity = byte_size_setting("TRACER_CACHE_SIZE", DEFAULT_CACHE_SIZE)  # bad values fail early
    if directory is None or not _trusted_directory(directory):
        return None
    secret = _secret(directory)
    if secret is None:
        return None
    return ObjectCache(directory, key, secret, capacity, suffix)


class ObjectCache:
    """One entry of the disk cache: `load()` the object code if a valid entry exists, `store()` it."""

    def __init__(self, directory: str, key: bytes, secret: bytes,
                 capacity: int = DEFAULT_CACHE_SIZE, suffix: str = OBJECT_SUFFIX):
        self.directory = directory
        self.key = key
        self.path = os.path.join(directory, f"{key.hex()}{suffix}")
        self._secret = secret
        self.capacity = capacity  # of the whole directory, in bytes

    def _header(self, payload: bytes) -> bytes:
        fields = (MAGIC, FORMAT, self.key, len(payload))
        mac = hmac.new(self._secret, _HEADER.pack(*fields, bytes(32)) + payload, hashlib.sha256)
        return _HEADER.pack(*fields, mac.digest())

    def _read(self) -> bytes | None:
        """The entry's bytes if it is a regular file of a plausible size; touches it (recency)."""
        try:
            descriptor = os.open(self.path, _OPEN_FLAGS)
        except OSError:
            return None  # absent, or a symlink (ELOOP)
        try:
            status = os.fstat(descriptor)
            limit = _HEADER.size + MAX_ENTRY_BYTES
            if not stat.S_ISREG(status.st_mode) or status.st_size > limit:
                return None
            chunks, remaining = [], limit + 1  # a file that grows while read stops at the limit
            while remaining > 0:
                chunk = os.read(descriptor, min(remaining, 1 << 20))
                if not chunk:
                    break
                chunks.append(chunk)
                remaining -= len(chunk)
            os.utime(descriptor)
        except OSError:
            return None
        finally:
            os.close(descriptor)
        return b"".join(chunks)

    def load(self) -> bytes | None:
        data = self._read()
        if data is None or len(data) < _HEADER.size:
            return None
        payload = data[_HEADER.size:]
        if len(payload) > MAX_ENTRY_BYTES or not hmac.compare_digest(data[:_HEADER.size],
                                                                     self._header(payload)):
            return None
        return payload

    def store(self, payload: bytes) -> None:
        if len(payload) > MAX_ENTRY_BYTES:
            return
        import tempfile  # (with shutil, random, bz2 and lzma: ~6 ms, not needed to load)
        try:
            descriptor, temporary = tempfile.mkstemp(dir=self.directory, prefix=".tmp-")
            try:
                with os.fdopen(descriptor, "wb") as file:
                    file.write(self._header(payload) + payload)
                os.replace(temporary, self.path)
            except BaseException:
                os.unlink(temporary)
                raise
            _account_for_store(self.directory, len(payload) + _HEADER.size, self.capacity)
        except OSError:
            pass  # a read-only or full disk only costs a recompilation next time


def _account_for_store(directory: str, size: int, capacity: int) -> None:
    """Add a stored entry's `size` to the directory's ledger; count and evict where the entries
    may take more than `capacity` bytes (or the ledger cannot tell)."""
    descriptor = os.open(os.path.join(directory, LEDGER_NAME),
                         os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        with _locked(descriptor):
            recorded = os.pread(descriptor, _LEDGER.size + 1, 0)
            total = _LEDGER.unpack(recorded)[0] if len(recorded) == _LEDGER.size else -1
            if 0 <= total <= capacity - size:
                os.pwrite(descriptor, _LEDGER.pack(total + size), 0)
                return
        # (counted unlocked: other processes' stores wait for no count; see the docstring)
        total = evict_least_recently_used(directory, capacity - capacity // 8)
        with _locked(descriptor):
            os.ftruncate(descriptor, 0)
            os.pwrite(descriptor, _LEDGER.pack(total), 0)
    finally:
        os.close(descriptor)


@contextlib.contextmanager
def _locked(descriptor: int) -> Iterator[None]:
    import fcntl  # (stores only: a process that only loads never needs it)
    fcntl.flock(descriptor, fcntl.LOCK_EX)
    try:
        yield
    finally:
        fcntl.flock(descriptor, fcntl.LOCK_UN)


def evict_least_recently_used(directory: str, capacity: int) -> int:
    """Delete the entries of `directory` least recently used (stored or loaded) until the rest
    take at most `capacity` bytes; return how many bytes the rest take."""
    entries = []
    with os.scandir(directory) as listing:
        for item in listing:
            if item.name.endswith(SUFFIXES) and item.is_file(follow_symlinks=False):
                status = item.stat(follow_symlinks=False)
                entries.append((status.st_mtime_ns, status.st_size, item.path))
    total = sum(size for _, size, _ in entries)
    for _, size, path in sorted(entries):
        if total <= capacity:
            break
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass  # another process evicted it first
        total -= size
    return total
