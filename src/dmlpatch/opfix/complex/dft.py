"""Discrete Fourier transforms composed of the operators DirectML runs: matrix products.

DirectML has no FFT and no complex type, so a transform here works on complex numbers held
as pairs of reals, ``[..., n, 2]`` (real part, imaginary part: the layout of
``torch.view_as_real``), and is built from ``matmul``/``bmm``, ``permute`` and ``reshape``:

- up to :data:`DIRECT` points, one product with the ``2n x 2n`` real matrix of the DFT acting
  on the interleaved pairs (``n x 2n`` for a real input, ``2n x n`` when only the real part of
  the result is wanted);
- beyond, the four-step (Cooley-Tukey) split ``n = n1 * n2``: transforms of length ``n1``
  with the twiddle factors folded into one batched product, then transforms of length ``n2``
  (recursively);
- a length with no factor up to :data:`DIRECT` (a large prime) goes through Bluestein's chirp
  convolution, computed with power-of-two transforms.

The matrices are built in float64 on the host from exact integer phases (``j*k mod n``), then
cast, moved to the device once and kept (:data:`CACHE_SIZE` of them). Every function takes
and returns unnormalised transforms along the last complex dimension; scaling and
``onesided`` slicing belong to the caller. ``sign`` is -1 for the forward transform
(``exp(-2 pi i jk/n)``) and +1 for the inverse.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from typing import Callable

import torch

#: Longest transform done as one product with its dense matrix.
DIRECT = 512
#: Device matrices kept, least recently used dropped first.
CACHE_SIZE = 64

_lock = threading.Lock()
_cache: OrderedDict[tuple[object, ...], torch.Tensor] = OrderedDict()


def _cached(key: tuple[object, ...], build: Callable[[], torch.Tensor]) -> torch.Tensor:
    with _lock:
        found = _cache.get(key)
        if found is not None:
            _cache.move_to_end(key)
            return found
    made = build()
    with _lock:
        _cache[key] = made
        while len(_cache) > CACHE_SIZE:
            _cache.popitem(last=False)
    return made


def _phases(rows: int, cols: int, n: int, sign: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of ``sign * 2 pi j k / n`` for ``j < rows``, ``k < cols``, in float64."""
    j = torch.arange(rows, dtype=torch.int64).unsqueeze(1)
    k = torch.arange(cols, dtype=torch.int64).unsqueeze(0)
    angle = (j * k % n).to(torch.float64) * (sign * 2 * math.pi / n)
    return torch.cos(angle), torch.sin(angle)


def _complex_matrix(cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The real ``2r x 2c`` matrix acting on interleaved pairs as ``cos + i sin`` does."""
    rows, cols = cos.shape
    m = torch.empty(rows, 2, cols, 2, dtype=cos.dtype)
    m[:, 0, :, 0] = cos
    m[:, 1, :, 0] = -sin
    m[:, 0, :, 1] = sin
    m[:, 1, :, 1] = cos
    return m.reshape(2 * rows, 2 * cols)


def _real_matrix(cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The ``r x 2c`` matrix taking a real vector to pairs, as ``cos + i sin`` does."""
    rows, cols = cos.shape
    return torch.stack((cos, sin), dim=-1).reshape(rows, 2 * cols)


def _to_device(m: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return m.to(dtype=like.dtype).to(like.device)


def _dense(n: int, sign: int, real_in: bool, like: torch.Tensor) -> torch.Tensor:
    def build() -> torch.Tensor:
        cos, sin = _phases(n, n, n, sign)
        m = _real_matrix(cos, sin) if real_in else _complex_matrix(cos, sin)
        return _to_device(m, like)

    return _cached(("dense", n, sign, real_in, like.dtype, like.device), build)


def _dense_real_out(n: int, sign: int, like: torch.Tensor) -> torch.Tensor:
    """``2n x n``: pairs to the real part of their transform."""

    def build() -> torch.Tensor:
        cos, sin = _phases(n, n, n, sign)
        m = torch.stack((cos, -sin), dim=1).reshape(2 * n, n)
        return _to_device(m, like)

    return _cached(("dense-real-out", n, sign, like.dtype, like.device), build)


def _twiddled(n1: int, n2: int, sign: int, real_in: bool, like: torch.Tensor) -> torch.Tensor:
    """``[n2, (1|2) n1, 2 n1]``: for each ``j2``, the length-``n1`` DFT followed by the
    twiddle factors ``exp(sign 2 pi i j2 k1 / (n1 n2))`` of its outputs ``k1``."""

    def build() -> torch.Tensor:
        n = n1 * n2
        cos, sin = _phases(n1, n1, n1, sign)  # [j1, k1]
        tw_cos, tw_sin = _phases(n2, n1, n, sign)  # [j2, k1]
        # (cos + i sin)(tw_cos + i tw_sin), for every j2.
        c = cos.unsqueeze(0) * tw_cos.unsqueeze(1) - sin.unsqueeze(0) * tw_sin.unsqueeze(1)
        s = cos.unsqueeze(0) * tw_sin.unsqueeze(1) + sin.unsqueeze(0) * tw_cos.unsqueeze(1)
        if real_in:
            m = torch.stack((c, s), dim=-1).reshape(n2, n1, 2 * n1)
        else:
            m = torch.empty(n2, n1, 2, n1, 2, dtype=torch.float64)
            m[:, :, 0, :, 0] = c
            m[:, :, 1, :, 0] = -s
            m[:, :, 0, :, 1] = s
            m[:, :, 1, :, 1] = c
            m = m.reshape(n2, 2 * n1, 2 * n1)
        return _to_device(m, like)

    return _cached(("twiddled", n1, n2, sign, real_in, like.dtype, like.device), build)


def _split(n: int) -> int:
    """The factor ``n1 <= DIRECT`` of ``n`` closest to its square root (1: none)."""
    best = 1
    for f in range(2, min(n, DIRECT) + 1):
        if n % f == 0 and abs(math.log(f / math.sqrt(n))) < abs(math.log(best / math.sqrt(n))):
            best = f
    return best


def transform(z: torch.Tensor, sign: int) -> torch.Tensor:
    """The DFT of the pairs ``z`` (``[..., n, 2]``) along ``n``; same shape."""
    n = z.shape[-2]
    lead = z.shape[:-2]
    flat = z.reshape(-1, n, 2)
    return _complex(flat, n, sign).reshape(*lead, n, 2)


def transform_real(x: torch.Tensor, sign: int) -> torch.Tensor:
    """The DFT of the real ``x`` (``[..., n]``) along its last dimension: ``[..., n, 2]``, all
    ``n`` outputs (the caller keeps ``n // 2 + 1`` for a one-sided transform)."""
    n = x.shape[-1]
    lead = x.shape[:-1]
    flat = x.reshape(-1, n)
    return _real(flat, n, sign).reshape(*lead, n, 2)


def transform_to_real(z: torch.Tensor, n: int, sign: int) -> torch.Tensor:
    """The real signal of length ``n`` whose one-sided spectrum is ``z`` (``[..., m, 2]``):
    the spectrum is completed as Hermitian (bins beyond ``m`` are zero), transformed, and its
    real part returned (``[..., n]``), as ``irfft`` does."""
    half = n // 2 + 1
    m = z.shape[-2]
    if m < half:
        pad = z.new_zeros(*z.shape[:-2], half - m, 2)
        z = torch.cat((z, pad), dim=-2)
    elif m > half:
        z = z[..., :half, :]
    # Bins n - k for k in 1 .. n - half: conjugates of bins k, in reverse order.
    mirrored = z[..., 1 : n - half + 1, :].flip(-2)
    mirrored = torch.stack((mirrored[..., 0], -mirrored[..., 1]), dim=-1)
    full = torch.cat((z, mirrored), dim=-2)
    lead = full.shape[:-2]
    flat = full.reshape(-1, n * 2)
    if n <= DIRECT:
        out = flat @ _dense_real_out(n, sign, flat)
    else:
        out = _complex(flat.reshape(-1, n, 2), n, sign)[..., 0]
    return out.reshape(*lead, n)


def _complex(z: torch.Tensor, n: int, sign: int) -> torch.Tensor:
    """``[b, n, 2]`` -> ``[b, n, 2]``."""
    if n <= DIRECT:
        return (z.reshape(-1, 2 * n) @ _dense(n, sign, False, z)).reshape(-1, n, 2)
    n1 = _split(n)
    if n1 == 1:
        return _bluestein(z, n, sign)
    n2 = n // n1
    b = z.shape[0]
    # Input index j = n2 j1 + j2: transform over j1 for every j2, twiddles folded in.
    staged = z.reshape(b, n1, n2, 2).permute(2, 0, 1, 3).reshape(n2, b, 2 * n1)
    y = torch.bmm(staged, _twiddled(n1, n2, sign, False, z))  # [j2, b, (k1, 2)]
    return _finish(y, b, n1, n2, sign)


def _real(x: torch.Tensor, n: int, sign: int) -> torch.Tensor:
    """``[b, n]`` real -> ``[b, n, 2]``."""
    if n <= DIRECT:
        return (x @ _dense(n, sign, True, x)).reshape(-1, n, 2)
    n1 = _split(n)
    if n1 == 1:
        return _bluestein(torch.stack((x, torch.zeros_like(x)), dim=-1), n, sign)
    n2 = n // n1
    b = x.shape[0]
    staged = x.reshape(b, n1, n2).permute(2, 0, 1).contiguous()  # [j2, b, j1]
    y = torch.bmm(staged, _twiddled(n1, n2, sign, True, x))
    return _finish(y, b, n1, n2, sign)


def _finish(y: torch.Tensor, b: int, n1: int, n2: int, sign: int) -> torch.Tensor:
    """From ``[j2, b, (k1, 2)]``: transforms over ``j2``; output index ``k = k1 + n1 k2``."""
    rows = y.reshape(n2, b, n1, 2).permute(1, 2, 0, 3).reshape(b * n1, n2, 2)
    out = _complex(rows, n2, sign)  # [(b, k1), k2, 2]
    return out.reshape(b, n1, n2, 2).permute(0, 2, 1, 3).reshape(b, n1 * n2, 2)


def _multiply(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Product of pairs (``[..., 2]``), broadcasting."""
    ar, ai = a[..., 0], a[..., 1]
    br, bi = b[..., 0], b[..., 1]
    return torch.stack((ar * br - ai * bi, ar * bi + ai * br), dim=-1)


def _chirp(n: int, sign: int, like: torch.Tensor) -> torch.Tensor:
    """``exp(sign pi i j^2 / n)`` for ``j < n`` as pairs (``j^2 mod 2n`` keeps it exact)."""

    def build() -> torch.Tensor:
        j = torch.arange(n, dtype=torch.int64)
        angle = (j * j % (2 * n)).to(torch.float64) * (sign * math.pi / n)
        return _to_device(torch.stack((torch.cos(angle), torch.sin(angle)), dim=-1), like)

    return _cached(("chirp", n, sign, like.dtype, like.device), build)


def _chirp_filter(n: int, m: int, sign: int, like: torch.Tensor) -> torch.Tensor:
    """The length-``m`` forward transform of ``conj(chirp)`` laid out for circular convolution."""

    def build() -> torch.Tensor:
        j = torch.arange(n, dtype=torch.int64)
        angle = (j * j % (2 * n)).to(torch.float64) * (-sign * math.pi / n)
        taps = torch.zeros(m, 2, dtype=torch.float64)
        taps[:n, 0], taps[:n, 1] = torch.cos(angle), torch.sin(angle)
        taps[m - n + 1 :] = taps[1:n].flip(0)
        return _to_device(taps, like)

    filter_taps = _cached(("chirp-taps", n, m, sign, like.dtype, like.device), build)
    return _cached(
        ("chirp-filter", n, m, sign, like.dtype, like.device),
        lambda: _complex(filter_taps.unsqueeze(0), m, -1)[0],
    )


def _bluestein(z: torch.Tensor, n: int, sign: int) -> torch.Tensor:
    """Bluestein: ``X[k] = c[k] sum_j (x[j] c[j]) conj(c[k - j])`` with ``c[j] =
    exp(sign pi i j^2 / n)``, the convolution done with transforms of a power-of-two length."""
    m = 1 << (2 * n - 2).bit_length()
    chirp = _chirp(n, sign, z)
    a = _multiply(z, chirp)
    padded = torch.cat((a, a.new_zeros(a.shape[0], m - n, 2)), dim=-2)
    spectrum = _multiply(_complex(padded, m, -1), _chirp_filter(n, m, sign, z))
    convolved = _complex(spectrum, m, 1)[:, :n] / m
    return _multiply(convolved, chirp)
