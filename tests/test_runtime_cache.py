"""The caches run only code this user's process wrote, and stay bounded: authenticated disk
entries, untrusted directories and secrets refused, special files never opened for reading, a size
cap with least-recently-used eviction on disk, native code freed with the last signature holding
it, a per-function signature limit with a warning that says why it recompiled, and one compile per
signature however many threads race for it."""
from __future__ import annotations

import gc
import hashlib
import logging
import os
import resource
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import tracer as tr
from tracer import ir
from tracer.ir.types import TensorType
from tracer.runtime import cache, jit
from tracer.runtime.compiled import CompiledFunction
from tracer.runtime.pipeline import compile_graph
from tracer.runtime.signatures import recompile_reason
from tracer.runtime.traced_function import TracedFunction

ROOT = Path(__file__).resolve().parent.parent


def scaled(factor: float, size: int = 64) -> ir.Graph:
    """x * factor: functions that differ only in a constant have interchangeable object code."""
    function = ir.Graph("scaled")
    x = function.add_parameter("x", TensorType((size,), "f64"))
    function.outputs = [ir.GraphBuilder(function).mul(x, factor)]
    return ir.optimize(function)


def entry_path(compiled: CompiledFunction, directory: Path) -> Path:
    return directory / f"{compiled.disk_key.hex()}.o"


def compile_counting(function: ir.Graph) -> tuple[np.ndarray, int, int]:
    """The result on 0..63 of a fresh compile of `function`, and how many modules this compiled
    to machine code and loaded from the disk cache."""
    before = dict(jit.STATISTICS)
    result = compile_graph(function)([np.arange(64.0)])[0]
    return (result, jit.STATISTICS["compiled"] - before["compiled"],
            jit.STATISTICS["disk_hits"] - before["disk_hits"])


@pytest.fixture
def directory(tmp_path, monkeypatch) -> Path:
    folder = tmp_path / "cache"
    monkeypatch.setenv("TRACER_CACHE_DIR", str(folder))
    monkeypatch.delenv("TRACER_DISABLE_CACHE", raising=False)
    return folder


# Authentication ----------------------------------------------------------------------------------

def relabel(entry: Path, source: Path, key: bytes, mac: bytes | None = None) -> None:
    """Write `source`'s object code into `entry` under `entry`'s key, with `mac` (by default a
    fresh SHA-256 of the payload, which is all the cache used to check)."""
    payload = source.read_bytes()[cache._HEADER.size:]
    mac = hashlib.sha256(payload).digest() if mac is None else mac
    header = cache._HEADER.pack(cache.MAGIC, cache.FORMAT, key, len(payload), mac)
    entry.write_bytes(header + payload)


def test_object_code_of_another_signature_relabelled_is_refused_and_recompiled(directory):
    double, triple = scaled(2.0), scaled(3.0)
    x = np.arange(64.0)
    np.testing.assert_array_equal(compile_counting(double)[0], 2 * x)
    np.testing.assert_array_equal(compile_counting(triple)[0], 3 * x)
    double_entry = entry_path(compile_graph(double), directory)
    triple_entry = entry_path(compile_graph(triple), directory)
    key = bytes.fromhex(double_entry.stem)

    relabel(double_entry, triple_entry, key)
    result, compiled, hits = compile_counting(double)
    assert (compiled, hits) == (1, 0)
    np.testing.assert_array_equal(result, 2 * x)

    # A MAC under another secret is refused too.
    relabel(double_entry, triple_entry, key, mac=bytes(32))
    assert compile_counting(double)[1:] == (1, 0)

    # The control: signed with this user's secret, the relabelled code is run (its result is 3x),
    # so what refuses the forgeries above is the authentication, not some other difference.
    secret = (directory / cache.SECRET_NAME).read_bytes()
    payload = triple_entry.read_bytes()[cache._HEADER.size:]
    signed = cache.ObjectCache(directory, key, secret)
    double_entry.write_bytes(signed._header(payload) + payload)
    result, compiled, hits = compile_counting(double)
    assert (compiled, hits) == (0, 1)
    np.testing.assert_array_equal(result, 3 * x)


def test_secret_is_private_and_created_once(directory):
    compile_counting(scaled(4.0))
    secret = directory / cache.SECRET_NAME
    status = secret.lstat()
    assert oct(status.st_mode & 0o777) == oct(0o600) and status.st_uid == os.geteuid()
    assert oct(directory.stat().st_mode & 0o777) == oct(0o700)
    content = secret.read_bytes()
    assert len(content) == 32
    compile_counting(scaled(5.0))
    assert secret.read_bytes() == content
    assert not [p for p in directory.iterdir() if p.name.startswith(".tmp-")]


def in_thread(action, timeout: float = 30.0):
    """Run `action` in a daemon thread; fail (rather than hang) if it takes longer than timeout."""
    outcome = []
    thread = threading.Thread(target=lambda: outcome.append(action()), daemon=True)
    thread.start()
    thread.join(timeout)
    assert not thread.is_alive(), f"still running after {timeout} s"
    return outcome[0]


def assert_memory_only(directory: Path, caplog, reason: str) -> None:
    """A compile works, writes no entry, and the reason is logged on tracer.cache."""
    caplog.set_level(logging.WARNING, logger="tracer.cache")
    result, compiled, hits = in_thread(lambda: compile_counting(scaled(6.0)))
    np.testing.assert_array_equal(result, 6 * np.arange(64.0))
    assert (compiled, hits) == (1, 0)
    assert not list(directory.glob("*.o"))
    messages = [r.getMessage() for r in caplog.records if r.name == "tracer.cache"]
    assert any(reason in m and str(directory) in m and "memory only" in m for m in messages), \
        messages


@pytest.mark.parametrize("mode, reason", [(0o777, "writable by other users (mode 777)"),
                                          (0o720, "writable by other users (mode 720)")])
def test_directory_others_can_write_is_not_used(directory, caplog, mode, reason):
    directory.mkdir()
    directory.chmod(mode)
    assert_memory_only(directory, caplog, reason)


def test_directory_of_another_user_is_not_used(directory, caplog):
    if os.geteuid() != 0:
        pytest.skip("making a directory owned by someone else needs root")
    directory.mkdir(mode=0o700)
    os.chown(directory, 4242, 4242)
    assert_memory_only(directory, caplog, "owned by uid 4242")


@pytest.mark.parametrize("make, reason", [
    (lambda secret: (secret.write_bytes(os.urandom(32)), secret.chmod(0o644)), "mode 644"),
    (lambda secret: (secret.write_bytes(os.urandom(32)), secret.chmod(0o600),
                     os.geteuid() == 0 and os.chown(secret, 4242, 4242)),
     "owned by uid 4242" if os.geteuid() == 0 else "skip"),
    (lambda secret: secret.symlink_to(secret.parent.parent / "elsewhere"), "symlink"),
    (lambda secret: os.mkfifo(secret, 0o600), "not a regular file"),
], ids=["mode 644", "another owner", "symlink", "fifo"])
def test_untrusted_secret_is_not_used(directory, caplog, make, reason):
    if reason == "skip":
        pytest.skip("making a file owned by someone else needs root")
    directory.mkdir(mode=0o700)
    (directory.parent / "elsewhere").write_bytes(os.urandom(32))
    make(directory / cache.SECRET_NAME)
    assert_memory_only(directory, caplog, reason)


# Special files -----------------------------------------------------------------------------------

def test_fifo_entry_does_not_hang_and_is_replaced(directory):
    function = scaled(7.0)
    entry = entry_path(compile_graph(function), directory)
    entry.unlink()
    os.mkfifo(entry, 0o600)
    result, compiled, hits = in_thread(lambda: compile_counting(function))
    assert (compiled, hits) == (1, 0)
    np.testing.assert_array_equal(result, 7 * np.arange(64.0))
    assert entry.is_file()  # the store replaced the FIFO with a good entry
    assert compile_counting(function)[1:] == (0, 1)


def test_symlinked_entry_is_not_followed(directory, tmp_path):
    function = scaled(8.0)
    entry = entry_path(compile_graph(function), directory)
    valid = tmp_path / "valid.o"
    entry.rename(valid)
    entry.symlink_to(valid)  # even a link to a good entry: nothing outside the directory is run
    assert compile_counting(function)[1:] == (1, 0)
    assert not entry.is_symlink()


LOAD_SCRIPT = textwrap.dedent("""
    import sys
    from pathlib import Path
    from tracer.runtime import cache
    directory = Path(sys.argv[1])
    secret = (directory / cache.SECRET_NAME).read_bytes()
    key = bytes.fromhex(sys.argv[2])
    print(cache.ObjectCache(directory, key, secret).load() is None)
""")


@pytest.mark.parametrize("kind", ["symlink to /dev/zero", "oversized regular file"])
def test_entry_that_never_ends_is_not_read(directory, kind):
    """Loaded in a child process limited to 1 GiB of address space, so a regression fails with a
    MemoryError instead of filling this machine's memory."""
    entry = entry_path(compile_graph(scaled(9.0)), directory)
    entry.unlink()
    if kind == "symlink to /dev/zero":
        entry.symlink_to("/dev/zero")
    else:
        with open(entry, "wb") as file:  # sparse: takes no disk space
            file.truncate(cache._HEADER.size + cache.MAX_ENTRY_BYTES + 1)

    def limit_memory():
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))

    environment = dict(os.environ, PYTHONPATH=str(ROOT), OPENBLAS_NUM_THREADS="1")
    started = time.monotonic()
    output = subprocess.run([sys.executable, "-c", LOAD_SCRIPT, str(directory), entry.stem],
                            env=environment, preexec_fn=limit_memory, capture_output=True,
                            text=True, timeout=120)
    assert output.returncode == 0, output.stderr[-2000:]
    assert output.stdout.split() == ["True"]
    assert time.monotonic() - started < 60


# Size cap on disk --------------------------------------------------------------------------------

def test_disk_cache_evicts_least_recently_used_past_its_size(directory, monkeypatch):
    functions = {name: scaled(factor) for name, factor in (("a", 10.0), ("b", 11.0), ("c", 12.0))}
    entries = {}
    for name, function in functions.items():
        compile_counting(function)
        entries[name] = entry_path(compile_graph(function), directory)
    sizes = {name: path.stat().st_size for name, path in entries.items()}
    entries["c"].unlink()
    past = time.time() - 1000
    os.utime(entries["a"], (past, past))       # a is older than b ...
    os.utime(entries["b"], (past + 1, past + 1))
    assert compile_counting(functions["a"])[1:] == (0, 1)  # ... until this hit uses it
    # (eviction leaves an eighth of the size free: a and c fill the other seven eighths)
    monkeypatch.setenv("TRACER_CACHE_SIZE", str((sizes["a"] + sizes["c"]) * 8 // 7 + 8))
    assert compile_counting(functions["c"])[1:] == (1, 0)  # the store goes past the size
    assert entries["a"].exists() and entries["c"].exists() and not entries["b"].exists()
    assert (directory / cache.SECRET_NAME).exists()  # the secret is not an entry


def store_numbered(directory, numbers, capacity: int, payload: bytes = b"x" * 1000) -> None:
    for number in numbers:
        cache.ObjectCache(directory, number.to_bytes(32, "little"), b"s" * 32, capacity).store(
            payload)


@pytest.fixture
def scans(monkeypatch) -> list:
    """The counts of the cache directory made (each stats every entry)."""
    made = []
    counting = cache.evict_least_recently_used
    monkeypatch.setattr(cache, "evict_least_recently_used",
                        lambda *arguments: made.append(arguments) or counting(*arguments))
    return made


def entry_bytes(payload_bytes: int = 1000) -> int:
    return payload_bytes + cache._HEADER.size


def entries_size(directory) -> int:
    return sum(path.stat().st_size for path in directory.glob("*.o"))


def test_stores_count_the_directory_only_when_its_ledger_goes_past_the_size(tmp_path, scans):
    # Counting stats every entry (2.9 s for the 255,000 entries of a full 1 GiB cache), so it may
    # not happen at every store, nor at each process's first store
    capacity = 80 * entry_bytes()
    store_numbered(tmp_path, range(25), capacity)
    assert len(scans) == 1  # the first store: no ledger yet
    assert cache._LEDGER.unpack((tmp_path / cache.LEDGER_NAME).read_bytes()) == (
        (entries_size(tmp_path),))
    (tmp_path / f"{(0).to_bytes(32, 'little').hex()}.o").unlink()  # as if deleted by hand
    smaller = 20 * entry_bytes()
    store_numbered(tmp_path, [99], smaller)
    assert len(scans) == 2  # the store goes past the new size: count, evict below it
    assert entries_size(tmp_path) <= smaller - smaller // 8
    assert (tmp_path / f"{(99).to_bytes(32, 'little').hex()}.o").exists()
    # A full cache: eviction leaves room for an eighth of it, so the next count comes an eighth
    # later, not at every store (which counted the whole directory again each time)
    store_numbered(tmp_path, range(100, 125), smaller)
    assert len(scans) <= 2 + 25 // 2
    assert entries_size(tmp_path) <= smaller
    assert cache._LEDGER.unpack((tmp_path / cache.LEDGER_NAME).read_bytes()) == (
        (entries_size(tmp_path),))


def test_a_new_process_storing_into_a_nearly_full_cache_counts_nothing(tmp_path, scans):
    store_numbered(tmp_path, range(30), 40 * entry_bytes())
    assert len(scans) == 1
    # 31 entries fit 32, but not the seven eighths a count evicts to: a count would delete some
    command = ("import sys; from tracer.runtime import cache; "
               "cache.ObjectCache(sys.argv[1], bytes([255]) * 32, b's' * 32, int(sys.argv[2]))"
               ".store(b'y' * 1000)")
    before = entries_size(tmp_path)
    output = subprocess.run([sys.executable, "-c", command, str(tmp_path), str(32 * entry_bytes())],
                            capture_output=True, text=True, timeout=60,
                            env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert output.returncode == 0, output.stderr[-2000:]
    assert entries_size(tmp_path) == before + entry_bytes()  # nothing evicted: not counted
    assert cache._LEDGER.unpack((tmp_path / cache.LEDGER_NAME).read_bytes()) == (
        (before + entry_bytes(),))


@pytest.mark.parametrize("ledger", [None, b"", b"garbage", cache._LEDGER.pack(-5)])
def test_a_missing_or_unreadable_ledger_is_counted_again(tmp_path, scans, ledger):
    capacity = 10 * entry_bytes()
    store_numbered(tmp_path, range(12), 10**9)  # a cache filled past `capacity` ...
    path = tmp_path / cache.LEDGER_NAME
    path.unlink() if ledger is None else path.write_bytes(ledger)  # ... its ledger lost
    del scans[:]
    store_numbered(tmp_path, [50], capacity)
    assert len(scans) == 1
    assert entries_size(tmp_path) <= capacity - capacity // 8
    assert cache._LEDGER.unpack(path.read_bytes()) == (entries_size(tmp_path),)


@pytest.mark.parametrize("text, size", [("12345", 12345), ("512M", 512 * 2**20),
                                        ("2GiB", 2 * 2**30), ("3 kb", 3072)])
def test_cache_size_setting(monkeypatch, text, size):
    from tracer.runtime.settings import byte_size_setting
    monkeypatch.setenv("TRACER_CACHE_SIZE", text)
    assert byte_size_setting("TRACER_CACHE_SIZE", 1) == size


def test_bad_cache_settings_are_clear_errors(directory, monkeypatch):
    monkeypatch.setenv("TRACER_CACHE_SIZE", "lots")
    with pytest.raises(tr.SettingError, match="TRACER_CACHE_SIZE='lots' is not a size"):
        compile_counting(scaled(13.0))
    monkeypatch.delenv("TRACER_CACHE_SIZE")
    monkeypatch.setenv("TRACER_CACHE_LIMIT", "0")
    f = tr.trace(lambda x: x + 1)
    with pytest.raises(tr.SettingError, match="TRACER_CACHE_LIMIT='0'") as error:
        f(tr.ones(2))
    assert "test_runtime_cache.py" in str(error.value)  # names the user's line


# Signatures in memory ----------------------------------------------------------------------------

def live_engines() -> int:
    gc.collect()
    return sum(1 for o in gc.get_objects()
               if type(o).__name__ in ("LinkedCode", "ExecutionEngine"))  # loader's or MCJIT's


def test_signature_limit_evicts_least_recently_used_and_warns_why(monkeypatch):
    monkeypatch.setenv("TRACER_CACHE_LIMIT", "3")
    monkeypatch.setenv("TRACER_DISABLE_CACHE", "1")

    @tr.trace
    def affine(x, w):
        return x * w + 1

    w = tr.tensor(2.0)
    engines = live_engines()
    with pytest.warns(tr.CacheLimitWarning) as warned:
        for n in (1, 2, 3, 1, 4, 5):  # the call of shape 1 makes shape 2 the least recently used
            np.testing.assert_array_equal(affine(tr.ones(n, 11), w).numpy(), np.full((n, 11), 3.0))
    assert len(warned) == 1  # once per function
    message = str(warned[0].message)
    assert "affine" in message and "TRACER_CACHE_LIMIT=3" in message
    # warned at the first eviction, when shape 4 was compiled (compared with the latest, shape 1)
    assert "shape of x changed (3 times)" in message
    assert "Latest: shape of x: (1, 11) -> (4, 11)" in message
    assert warned[0].filename == __file__  # attributed to the user's line
    assert affine.cache_info() == (1, 5, 3)
    assert live_engines() - engines == 3  # the two evicted signatures' code is gone
    affine(tr.ones(1, 11), w)  # still cached
    affine(tr.ones(2, 11), w)  # evicted: compiled again
    assert affine.cache_info() == (2, 6, 3)
    affine.cache_clear()
    assert live_engines() == engines


def test_recompile_reasons_name_the_difference():
    def f(x, y, mode="a"):
        return x

    traced = tr.trace(f, static_argnums=(2,))

    def reason(first, second):
        (key_1, _), (key_2, leaves) = traced._key(*first), traced._key(*second)
        return recompile_reason(key_1, key_2, [path for _, path in leaves])

    x32, x64 = tr.zeros(3), tr.zeros(3, dtype=tr.float64)
    assert reason(((x32, 1.0), {}), ((tr.zeros(4), 1.0), {})) == "shape of x: (3,) -> (4,)"
    assert reason(((x32, 1.0), {}), ((x64, 1.0), {})) == "dtype of x: float32 -> float64"
    assert reason(((x32, 1.0), {}), ((tr.zeros(3, requires_grad=True), 1.0), {})) == \
        "requires_grad of x: False -> True"
    assert reason(((x32, 1.0), {}), ((x32, 1), {})) == "type of y: float -> int"
    assert reason(((x32, 1.0, "a"), {}), ((x32, 1.0, "b"), {})) == \
        "static value of argument 2: 'a' -> 'b'"
    assert reason(((x32, 1.0), {}), ((x32, x32), {})) == "type of y: float -> Tensor"
    assert reason(((x32, tr.zeros(3)), {}), ((x32, x32), {})) == "aliasing of y: object #1 -> #0"
    with_grad = tr.zeros(3, requires_grad=True)
    with_grad.grad = tr.zeros(3)
    assert reason(((tr.zeros(3, requires_grad=True), 1.0), {}), ((with_grad, 1.0), {})) == \
        ".grad of x: None -> shape (3,), dtype float32"
    assert recompile_reason(None, traced._key((x32, 1.0), {})[0], ["x", "y"]) == "first call"


SCALE = 2  # an int read from outside is compiled in (a float would be a runtime input)


def test_rebound_global_is_a_recompile_reason(monkeypatch):
    global SCALE
    monkeypatch.setenv("TRACER_CACHE_LIMIT", "1")
    f = tr.trace(lambda x: x * SCALE)
    saved = SCALE
    try:
        f(tr.ones(2))
        SCALE = 5
        np.testing.assert_array_equal(f(tr.ones(2)).numpy(), [5.0, 5.0])
        with pytest.warns(tr.CacheLimitWarning, match=r"global SCALE changed \(1 times\), "
                                                      r"shape of x changed \(1 times\)"):
            f(tr.ones(3))
    finally:
        SCALE = saved


RSS_SCRIPT = textwrap.dedent("""
    import ctypes, gc, json, os
    import tracer as tr
    from tracer.runtime.compiled import CompiledFunction

    def rss():
        gc.collect()
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        with open("/proc/self/statm") as file:
            return int(file.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def model(x, w):
        return (x.mm(w).tanh() * 2 - 1).relu().sum()

    w = tr.randn(8, 4)
    evicting, keeping = tr.trace(model), tr.trace(model)
    os.environ["TRACER_CACHE_LIMIT"] = "4"
    for n in range(1, 11):
        evicting(tr.randn(n, 8), w)
    start = rss()
    for n in range(11, 71):
        evicting(tr.randn(n, 8), w)
    evicted = rss()
    alive = sum(isinstance(o, CompiledFunction) for o in gc.get_objects())
    os.environ["TRACER_CACHE_LIMIT"] = "1000"
    for n in range(71, 131):
        keeping(tr.randn(n, 8), w)
    kept = rss()
    keeping.cache_clear()
    print(json.dumps(dict(evicted=evicted - start, kept=kept - evicted, cleared=kept - rss(),
                          alive=alive)))
""")


def test_evicted_signatures_free_their_native_code():
    """60 signatures compiled past a limit of 4 each give back what their native code takes: an
    evicted signature leaves over 35 KB less than a kept one (measured: ~0.18 MB against ~0.22 MB
    each, linked by runtime/loader.py; what remains is llvmlite's optimizer, which keeps ~95 KB per
    run, one run per optimized kernel module: the tanh's, not the matmul's, which only calls BLAS),
    and clearing the cache gives back over 6 KB each (measured: ~11-12 KB, the linked code's pages
    and the kernel modules' LLVM text a signature keeps: ~23-29 KB while every module carried the
    sin/cos reduction tables, ~65 KB while it carried every math function)."""
    environment = dict(os.environ, PYTHONPATH=str(ROOT), TRACER_DISABLE_CACHE="1",
                       OPENBLAS_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    output = subprocess.run([sys.executable, "-c", RSS_SCRIPT], env=environment, check=True,
                            capture_output=True, text=True, timeout=300).stdout
    measured = __import__("json").loads(output.strip().splitlines()[-1])
    assert measured["alive"] == 4
    assert measured["kept"] > 60 * 200_000, measured  # what the test compares with
    assert measured["kept"] - measured["evicted"] > 60 * 35_000, measured
    assert measured["cleared"] > 60 * 6_000, measured


# Threads -----------------------------------------------------------------------------------------

def race(traced, arguments: list, monkeypatch) -> tuple[list, int]:
    """Call `traced` on each argument from its own thread, all at once; (results or errors, how
    many times it was traced)."""
    compile_ = TracedFunction._compile
    compiles = []

    def slow_compile(self, *args, **kwargs):
        compiles.append(1)
        time.sleep(0.3)  # everyone else arrives while this one compiles
        return compile_(self, *args, **kwargs)

    monkeypatch.setattr(TracedFunction, "_compile", slow_compile)
    barrier = threading.Barrier(len(arguments))
    outcomes: list = [None] * len(arguments)

    def run(index):
        barrier.wait()
        try:
            outcomes[index] = traced(arguments[index])
        except Exception as error:  # noqa: BLE001 -- the test inspects it
            outcomes[index] = error

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(arguments))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not any(thread.is_alive() for thread in threads)
    return outcomes, len(compiles)


def test_eight_threads_compile_a_new_signature_once(monkeypatch):
    traced = tr.trace(lambda x: (x * 3).exp())
    inputs = [tr.tensor(np.full(5, float(i))) for i in range(8)]
    results, compiles = race(traced, inputs, monkeypatch)
    assert compiles == 1
    assert traced.cache_info() == (7, 1, 1)
    for value, result in zip(inputs, results):
        np.testing.assert_allclose(result.numpy(), np.exp(3 * value.numpy()), rtol=1e-6)


def test_a_failed_compile_is_the_error_of_every_waiting_thread(monkeypatch):
    traced = tr.trace(lambda x: x * 2 if x.sum().item() > 0 else x)
    outcomes, compiles = race(traced, [tr.ones(3) for _ in range(8)], monkeypatch)
    assert compiles == 1
    assert all(isinstance(o, tr.TracingError) for o in outcomes), outcomes
    assert traced.cache_info().size == 0


TEMPLATE_PROBE = textwrap.dedent("""
    import os, jinja2
    from tracer.codegen import template_environment
    from tracer.runtime import template_cache
    compiled = []
    original = jinja2.Environment.compile
    def counting(self, source, name=None, *args, **kwargs):
        compiled.append(name)
        return original(self, source, name, *args, **kwargs)
    jinja2.Environment.compile = counting
    template_cache.install()
    text = template_environment.render("parallel.ll.j2", name="k", kernel="k", buffers=2,
                                       threads=2, chunks=8)
    names = template_environment.compile_all()
    print(len(compiled), len(names), repr(text))
""")


def template_probe(environment: dict[str, str]) -> tuple[int, int, str]:
    """In a fresh process: how many templates it compiled, how many there are, and a text.
    `environment` adds to this process's (a variable set to None is left out)."""
    environment = {**os.environ, "PYTHONPATH": str(ROOT), **environment}
    finished = subprocess.run([sys.executable, "-c", TEMPLATE_PROBE], capture_output=True,
                              text=True, check=True, cwd=ROOT,
                              env={k: v for k, v in environment.items() if v is not None})
    compiled, templates, text = finished.stdout.split(" ", 2)
    return int(compiled), int(templates), text


def test_compiled_templates_are_kept_in_the_disk_cache_and_checked(directory, tmp_path):
    """Where no bytecode may be written beside the templates, a process that generates code
    compiles them once per user, not once per process: the next process loads their code from
    the disk cache (authenticated like object code: a tampered entry is compiled again, and
    renders the same text)."""
    def probe() -> tuple[int, int, str]:
        return template_probe({"PYTHONDONTWRITEBYTECODE": "1",
                               "PYTHONPYCACHEPREFIX": str(tmp_path / "bytecode")})

    first = probe()
    assert first[0] == first[1] > 5  # every template compiled (and stored)
    entries = sorted(directory.glob("*.template"))
    assert len(entries) == first[1]
    second = probe()
    assert second == (0, first[1], first[2])  # every template loaded, the same text rendered
    for entry in entries:  # payloads tampered with: the HMAC no longer matches
        data = bytearray(entry.read_bytes())
        data[-1] ^= 0xFF
        entry.write_bytes(bytes(data))
    assert probe() == first


def test_compiled_templates_are_kept_beside_them_as_bytecode_is(tmp_path):
    """Where Python writes bytecode, the templates' compiled code goes beside them (here under
    PYTHONPYCACHEPREFIX): a process with a fresh disk cache loads it instead of compiling; a
    stale or damaged file is compiled again and replaced."""
    prefix = tmp_path / "bytecode"

    def probe(cache: str) -> tuple[int, int, str]:
        return template_probe({"PYTHONPYCACHEPREFIX": str(prefix), "PYTHONDONTWRITEBYTECODE": None,
                               "TRACER_CACHE_DIR": str(tmp_path / cache)})

    first = probe("cache-1")
    files = sorted(prefix.rglob("*.jinja2"))
    assert first[0] == first[1] == len(files) > 5
    assert not list((tmp_path / "cache-1").glob("*.template"))  # not in the disk cache
    assert probe("cache-2") == (0, first[1], first[2])
    damaged = files[0].read_bytes()
    files[0].write_bytes(damaged[:len(damaged) // 2])
    assert probe("cache-3") == (1, first[1], first[2])
    assert files[0].read_bytes() == damaged  # compiled again, the same code
