"""Randomness: `Generator`, a counter-based generator built from primitives, whose numbers are
the same eagerly and traced and whose state is a tensor advanced in place (dropout's masks); and
the numpy generator `tr.manual_seed` also seeds, which tr.randn and tr.rand draw from eagerly
(numpy's samplers are ~6x faster than the counter-based one there) and integers and permutations
come from (eager only: a traced function would bake the numbers in, so there they raise). Inside
a traced function tr.randn and tr.rand draw from the counter-based generator: new numbers on
every call, as `empty(shape).normal_()` does -- other numbers than eagerly for the same seed, as
torch.compile's are than PyTorch eager's.

A Generator's state is one int64 counter. Drawing n numbers hashes the counters state .. state+n-1
and adds n to the state, so a traced draw reads the state as a runtime input and writes it back
advanced: a new mask on every call, never one baked into the compiled code. The hash is
Widynski's Squares, which needs only multiplication, addition and swapping 32-bit halves (taken
exactly through a float64 round trip: there are no bitwise primitives). Integer arithmetic wraps
modulo 2**64 in numpy and in the compiled code alike, so eager, interpreted and compiled draws
agree bit for bit.
"""
from __future__ import annotations

import builtins

import numpy as np

from tracer.context import state
from tracer.errors import ArgumentError, TracingError
from tracer.arithmetic import where
from tracer.creation import eager_generator, iota
from tracer.creation import manual_seed as _seed_numpy_generator
from tracer.dimensions import shape_arguments
from tracer.dispatch import leaf
from tracer.dtypes import as_dtype, float32, float64, int64
from tracer.tensor import Tensor


def randn(*shape, dtype=float32, requires_grad: builtins.bool = False) -> Tensor:
    """Standard normal samples from the generator seeded by `tr.manual_seed`."""
    return _random("randn", shape, dtype, requires_grad)


def rand(*shape, dtype=float32, requires_grad: builtins.bool = False) -> Tensor:
    """Uniform samples in [0, 1) from the generator seeded by `tr.manual_seed`."""
    return _random("rand", shape, dtype, requires_grad)


def randn_like(x: Tensor, dtype=None, requires_grad: builtins.bool = False) -> Tensor:
    return randn(*x.shape, dtype=dtype or x.dtype, requires_grad=requires_grad)


def rand_like(x: Tensor, dtype=None, requires_grad: builtins.bool = False) -> Tensor:
    return rand(*x.shape, dtype=dtype or x.dtype, requires_grad=requires_grad)


def _random(kind: str, shape, dtype, requires_grad: builtins.bool) -> Tensor:
    shape, dtype = shape_arguments(shape), as_dtype(dtype)
    if state.trace is not None:  # (see the module's docstring)
        sample = (_normal(default_generator, shape, kind) if kind == "randn"
                  else default_generator.uniform(shape, kind)).to(dtype)
        return sample.requires_grad_() if requires_grad else sample
    generator = eager_generator(kind)
    sample = generator.standard_normal(shape) if kind == "randn" else generator.random(shape)
    return leaf(sample.astype(dtype), requires_grad)


def randint(*args, size=None, dtype=int64, requires_grad: builtins.bool = False) -> Tensor:
    """Uniform integers in [low, high): `randint(high, size)` or `randint(low, high, size)`."""
    if size is None:
        if not args or not isinstance(args[-1], (tuple, list)):
            raise ArgumentError("randint takes (high, size) or (low, high, size), size a tuple")
        *args, size = args
    if len(args) not in (1, 2):
        raise ArgumentError("randint takes (high, size) or (low, high, size)")
    low, high = (0, args[0]) if len(args) == 1 else args
    if high <= low:
        raise ArgumentError(f"randint needs low < high, got low={low}, high={high}")
    generator = eager_generator("randint")
    sample = generator.integers(low, high, shape_arguments((size,)), dtype=np.int64)
    return leaf(sample.astype(as_dtype(dtype)), requires_grad)


def randperm(n: int, dtype=int64, requires_grad: builtins.bool = False) -> Tensor:
    """A random permutation of 0 .. n-1."""
    if n < 0:
        raise ArgumentError(f"randperm needs n >= 0, got {n}")
    sample = eager_generator("randperm").permutation(n)
    return leaf(sample.astype(as_dtype(dtype)), requires_grad)


# The key of Widynski's "Squares" counter-based generator (arXiv:2004.06278): a 64-bit constant
# with varied hexadecimal digits, as its key rules ask.
_KEY = int(np.uint64(0xC58EFD154CE32F6D).astype(np.int64))
_TWO_32 = 2 ** 32


def _halves(x: Tensor) -> tuple[Tensor, Tensor]:
    """The high and low 32 bits of an int64 tensor, each as an int64 in [0, 2**32). float64 keeps
    x's top 53 bits, so its truncated quotient by 2**32 is off by at most one, which the range of
    the low part then corrects."""
    high = (x.to(float64) * 2.0 ** -32).to(int64)
    low = x - high * _TWO_32
    below, above = low < 0, low >= _TWO_32
    low = where(below, low + _TWO_32, where(above, low - _TWO_32, low))
    high = where(below, high - 1, where(above, high + 1, high))
    return where(high < 0, high + _TWO_32, high), low


def _squares(counter: Tensor) -> Tensor:
    """Squares' 32-bit output for each int64 counter, in [0, 2**32): four rounds of squaring
    (the only non-linear operation among the primitives here) and swapping the halves."""
    y = counter * _KEY
    z = y + _KEY
    x = y
    for addend in (y, z, y):
        high, low = _halves(x * x + addend)
        x = low * _TWO_32 + high
    return _halves(x * x + z)[0]


def _squares_unsigned(counter: np.ndarray) -> np.ndarray:
    """`_squares` in numpy's uint64 arithmetic (which wraps as the int64 primitives do), where
    the halves swap with shifts: the same numbers, bit for bit (tests/test_random.py)."""
    key = np.uint64(_KEY % 2 ** 64)
    with np.errstate(over="ignore"):
        y = counter * key
        z = y + key
        x = y
        for addend in (y, z, y):
            x = x * x + addend
            x = (x >> np.uint64(32)) | (x << np.uint64(32))
        return ((x * x + z) >> np.uint64(32)).astype(np.float64)


def _seed_state(seed: int) -> int:
    """Seeds start their counters far apart: the seed through SplitMix64 (exact, in Python)."""
    x = (int(seed) + 0x9E3779B97F4A7C15) % 2 ** 64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) % 2 ** 64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) % 2 ** 64
    return int(np.uint64(x ^ (x >> 31)).astype(np.int64))


class Generator:
    """A counter-based random generator whose state is an int64 tensor (`.state`)."""

    def __init__(self, seed: int = 0) -> None:
        self.state = leaf(np.zeros((), np.int64), False)
        self.manual_seed(seed)

    def manual_seed(self, seed: int) -> "Generator":
        self.state._eager_array("Generator.manual_seed")[()] = _seed_state(seed)
        self.state._mark_changed()
        return self

    def uniform(self, shape: tuple[int, ...], what: str) -> Tensor:
        """float64 numbers uniform in [0, 1) on multiples of 2**-32; advances the state."""
        count = int(np.prod(shape, dtype=np.int64))
        if state.trace is None and self.state._trace is None:
            # eagerly, the same numbers from numpy's unsigned arithmetic, about five times faster
            # than the primitives run one by one (a million: 0.25 s, not 1.3 s)
            counters = np.arange(count, dtype=np.uint64) + self.state._handle.astype(np.uint64)
            numbers = leaf(_squares_unsigned(counters).reshape(shape) * 2.0 ** -32, False)
        else:
            counters = self.state + iota((count,), 0).reshape(shape)
            numbers = _squares(counters).to(float64) * 2.0 ** -32
        try:
            self.state.add_(count)
        except TracingError:
            raise TracingError(
                f"{what} inside a traced function draws from a generator whose state is not an "
                f"argument of the traced function, so it cannot advance between calls (the same "
                f"numbers every call); pass its state as an argument, "
                f"tr.default_generator.state, or call it in eval mode") from None
        return numbers


default_generator = Generator()


def manual_seed(seed: int) -> None:
    """Seed every generator of the library: the numpy one (randn, rand, randint, randperm,
    initializations) and `tr.default_generator` (dropout)."""
    _seed_numpy_generator(seed)
    default_generator.manual_seed(seed)


# get_rng_state's bytes: the 128-bit state and increment of PCG64 (the generator tr.manual_seed
# makes), its buffered 32-bit half (a flag and the value), then tr.default_generator's int64
# counter; little-endian.
_STATE_FIELDS = (("state", 16), ("inc", 16), ("has_uint32", 1), ("uinteger", 4), ("counter", 8))
_STATE_BYTES = sum(size for _, size in _STATE_FIELDS)


def get_rng_state() -> Tensor:
    """The state of every generator of the library as a uint8 tensor (as torch.get_rng_state): the
    numpy one that tr.manual_seed seeds and `tr.default_generator`. Saved in a checkpoint and
    given back to `set_rng_state`, the same numbers follow."""
    numpy_state = eager_generator("get_rng_state").bit_generator.state
    values = {**numpy_state["state"], "has_uint32": numpy_state["has_uint32"],
              "uinteger": numpy_state["uinteger"],
              "counter": int(default_generator.state.item()) % 2 ** 64}
    data = b"".join(values[name].to_bytes(size, "little") for name, size in _STATE_FIELDS)
    return leaf(np.frombuffer(data, np.uint8).copy(), False)


def set_rng_state(new_state) -> None:
    """Restore the generators from a `get_rng_state()` tensor (or its numpy array)."""
    array = np.asarray(new_state.numpy() if isinstance(new_state, Tensor) else new_state)
    if array.dtype != np.uint8 or array.shape != (_STATE_BYTES,):
        raise ArgumentError(f"set_rng_state takes the uint8 tensor of {_STATE_BYTES} bytes that "
                            f"tr.get_rng_state() returns, got {array.dtype} {array.shape}")
    data, values, start = array.tobytes(), {}, 0
    for name, size in _STATE_FIELDS:
        values[name] = int.from_bytes(data[start:start + size], "little")
        start += size
    generator = eager_generator("set_rng_state")
    generator.bit_generator.state = {
        "bit_generator": "PCG64", "state": {"state": values["state"], "inc": values["inc"]},
        "has_uint32": values["has_uint32"], "uinteger": values["uinteger"]}
    counter = int(np.uint64(values["counter"]).astype(np.int64))
    default_generator.state._eager_array("set_rng_state")[()] = counter
    default_generator.state._mark_changed()


def _normal(generator: Generator, shape: tuple[int, ...], what: str) -> Tensor:
    """float64 standard normal numbers by the Box-Muller transform of pairs of uniforms (1 - u
    is in (0, 1], so the logarithm is finite)."""
    uniforms = generator.uniform((2,) + tuple(shape), what)
    radius = (-2.0 * (1.0 - uniforms[0]).log()).sqrt()
    return radius * (uniforms[1] * (2 * np.pi)).cos()


def _generator(generator: Generator | None) -> Generator:
    if generator is None:
        return default_generator
    if not isinstance(generator, Generator):
        raise ArgumentError(f"generator= takes a tr.Generator, got {type(generator).__name__}")
    return generator


class RandomMethods:
    """Tensor's in-place random fills, drawn from `tr.default_generator` (seeded by
    tr.manual_seed) or `generator`: the same numbers eagerly and traced (given to Tensor by
    tracer/methods.py)."""

    def uniform_(self, a: float = 0.0, b: float = 1.0, *, generator: Generator | None = None,
                 **bounds) -> Tensor:
        """Numbers uniform in [a, b) (PyTorch's keywords `from` and `to` are taken too)."""
        a, b = bounds.pop("from", a), bounds.pop("to", b)
        if bounds:
            raise ArgumentError(f"uniform_ got unexpected keywords {sorted(bounds)}")
        if not a <= b:
            raise ArgumentError(f"uniform_ needs a <= b, got a={a}, b={b}")
        numbers = _generator(generator).uniform(self.shape, "uniform_")
        return self._assign(numbers * (b - a) + a, "uniform_", overwrites=True)

    def normal_(self, mean: float = 0.0, std: float = 1.0, *,
                generator: Generator | None = None) -> Tensor:
        """Numbers from the normal distribution of `mean` and `std`."""
        if std < 0:
            raise ArgumentError(f"normal_ needs std >= 0, got {std}")
        numbers = _normal(_generator(generator), self.shape, "normal_")
        return self._assign(numbers * std + mean, "normal_", overwrites=True)
