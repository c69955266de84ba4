"""The bits of 2/pi that sin and cos (templates/math.ll.j2) reduce large arguments with.

Payne-Hanek reduction multiplies x by 2/pi to as many bits as x's exponent asks for: x * 2/pi mod 4
gives the quadrant and the reduced argument, and the bits of 2/pi worth a multiple of 4 times x's
last bit drop out. A table per range of exponents (a bucket) holds the bits that remain, split into
chunks that are exact doubles; templates/math.ll.j2 picks a bucket's row by the exponent. The bits
come from pi computed here, exactly, from Machin's formula (no constant pasted in), once per process.
"""
from __future__ import annotations

import functools
import math


def _arctan_inverse(k: int, scale: int) -> tuple[int, int]:
    """arctan(1/k) * 2^scale truncated term by term, and a bound on its error in units."""
    total, power, n, terms = 0, (1 << scale) // k, 0, 0
    while power:
        term = power // (2 * n + 1)
        total += -term if n % 2 else term
        power //= k * k
        n, terms = n + 1, terms + 1
    return total, 2 * terms + 2  # each term truncated twice; the neglected tail below one unit


def pi_bounds(scale: int) -> tuple[int, int]:
    """Integers low < high with low <= pi * 2^scale <= high (Machin: pi = 16 atan(1/5) -
    4 atan(1/239))."""
    fifth, fifth_error = _arctan_inverse(5, scale)
    inverse_239, error_239 = _arctan_inverse(239, scale)
    approximation = 16 * fifth - 4 * inverse_239
    error = 16 * fifth_error + 4 * error_239
    return approximation - error, approximation + error


# The most bits of 2/pi a table asks for: the float64 one's last row needs 2^1151 * 2/pi.
MOST_BITS = 1200


@functools.cache
def _two_over_pi_bits() -> int:
    """floor(2^MOST_BITS * 2/pi), exact: computed from bounds on pi with more guard bits until
    both bounds give the same integer (once per process, a few milliseconds)."""
    guard = 64
    while True:
        scale = MOST_BITS + guard
        low, high = pi_bounds(scale)
        numerator = 1 << (MOST_BITS + 1 + scale)
        if numerator // high == numerator // low:
            return numerator // low
        guard *= 2


def two_over_pi_floor(exponent: int) -> int:
    """floor(2^exponent * 2/pi) for exponent <= MOST_BITS (floor(floor(y) / 2^k) = floor(y / 2^k))."""
    if exponent > MOST_BITS:
        raise ValueError(f"2/pi is computed to {MOST_BITS} bits, not {exponent}")
    return _two_over_pi_bits() >> (MOST_BITS - exponent) if exponent >= 0 else 0  # 2/pi < 1


def reduction_chunks(exponent: int, top: int, widths: tuple[int, ...]) -> list[float]:
    """The bits of 2^exponent * 2/pi from weight 2^top down, split into chunks of `widths` bits
    (each at most 53, so each chunk is an exact double), highest first: the sum of the chunks is
    (2^exponent * 2/pi mod 2^(top + 1)) truncated below its lowest chunk's last bit."""
    assert all(0 < width <= 53 for width in widths)
    low = top + 1 - sum(widths)  # weight of the last bit
    bits = two_over_pi_floor(exponent - low) % (1 << sum(widths))
    chunks, shift = [], sum(widths)
    for width in widths:
        shift -= width
        chunks.append(math.ldexp((bits >> shift) & ((1 << width) - 1), low + shift))
    return chunks


@functools.cache
def reduction_table(bias: int, bucket_bits: int, top: int,
                    widths: tuple[int, ...]) -> list[list[float]]:
    """One row of reduction_chunks per bucket of biased exponents: row b serves the biased exponents
    [b << bucket_bits, (b + 1) << bucket_bits) of a format with exponent `bias`, scaled so that the
    first of them is 2^0 (x * 2^(bias - (b << bucket_bits)) lies in [1, 2^(2^bucket_bits)))."""
    buckets = ((2 * bias + 1) >> bucket_bits) + 1
    return [reduction_chunks((b << bucket_bits) - bias, top, widths) for b in range(buckets)]
