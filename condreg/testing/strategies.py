"""Hypothesis strategies (the ``test`` extra) for matrices ``U diag(s) Vᵀ`` whose
spectrum is known exactly; a size is a value, an inclusive ``(low, high)`` range or a strategy.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
from hypothesis import strategies as st
from hypothesis.strategies import SearchStrategy

from condreg.testing import matrix_with_spectrum

__all__ = ["SpectralCase", "matrices", "spectra", "spectral_cases"]

IntSpec = int | tuple[int, int] | SearchStrategy
FloatSpec = float | tuple[float, float] | SearchStrategy


def _ints(spec: Any, name: str, minimum: int = 0) -> SearchStrategy:
    if isinstance(spec, SearchStrategy):
        return spec
    if isinstance(spec, int) and not isinstance(spec, bool):
        if spec < minimum:
            raise ValueError(f"{name} must be >= {minimum}, got {spec}")
        return st.just(spec)
    if isinstance(spec, tuple) and len(spec) == 2:
        lo, hi = spec
        if not (isinstance(lo, int) and isinstance(hi, int)) or lo < minimum or hi < lo:
            raise ValueError(f"{name} range must be integers {minimum} <= low <= high, got {spec}")
        return st.integers(lo, hi)
    raise TypeError(f"{name} must be an int, a (low, high) pair or a strategy, got {spec!r}")


def _floats(spec: Any, name: str, minimum: float) -> SearchStrategy:
    if isinstance(spec, SearchStrategy):
        return spec
    if isinstance(spec, (int, float)) and not isinstance(spec, bool):
        if not (math.isfinite(spec) and spec >= minimum):
            raise ValueError(f"{name} must be finite and >= {minimum}, got {spec}")
        return st.just(float(spec))
    if isinstance(spec, tuple) and len(spec) == 2:
        lo, hi = (float(v) for v in spec)
        if not (math.isfinite(lo) and math.isfinite(hi) and minimum <= lo <= hi):
            raise ValueError(f"{name} range must be finite with {minimum} <= low <= high: {spec}")
        return st.floats(lo, hi)
    raise TypeError(f"{name} must be a number, a (low, high) pair or a strategy, got {spec!r}")


def _positive_min(name: str, value: float, minimum: float) -> float:
    if not (math.isfinite(value) and value >= minimum):
        raise ValueError(f"drawn {name} = {value} is not finite and >= {minimum}")
    return value


def _spectrum_args(kappa: Any, sigma_min: Any, top_ties: Any, bottom_ties: Any, gap: Any) -> tuple:
    """The checked strategies of :func:`_spectrum`'s arguments, and ``gap`` as a float."""
    if not (isinstance(gap, (int, float)) and math.isfinite(gap) and gap >= 0):
        raise ValueError(f"gap must be a finite number >= 0, got {gap!r}")
    return (
        _floats(kappa, "kappa", 1.0),
        _floats(sigma_min, "sigma_min", 0.0),
        _ints(top_ties, "top_ties", 1),
        _ints(bottom_ties, "bottom_ties", 1),
        float(gap),
    )


@st.composite
def _spectrum(draw, k, kappa, sigma_min, top_ties, bottom_ties, gap) -> tuple[np.ndarray, int, int]:
    """``(values, t, b)``: a descending spectrum of rank ``k`` and its exact tie counts."""
    sk = _positive_min("sigma_min", float(draw(sigma_min)), 0.0)
    if sk <= 0:
        raise ValueError("sigma_min must be > 0 (zeros come from rows/cols > rank)")
    kap = _positive_min("kappa", float(draw(kappa)), 1.0)
    t = max(1, int(draw(top_ties)))
    b = max(1, int(draw(bottom_ties)))
    if k == 1 or (kap == 1.0 and gap == 0.0):
        return np.full(k, sk), k, k  # κ = 1: every value tied (top = bottom = all k)
    # k >= 2 and κ > 1: the two tied groups are disjoint; keep both non-empty
    t = min(t, k - 1)
    b = min(b, k - t)
    n_mid = k - t - b
    # with middle values, a few ulps more, so that σ_1 / (1 + gap) ≥ σ_k (1 + gap) after rounding
    need = (1.0 + gap) ** 2 * (1.0 + 8 * np.finfo(np.float64).eps) if n_mid else 1.0 + gap
    kap = max(kap, need, float(np.nextafter(1.0, 2.0)))
    s1 = sk * kap
    if n_mid:
        lo, hi = sk * (1.0 + gap), s1 / (1.0 + gap)
        unit = st.floats(0.0, 1.0, exclude_min=True, exclude_max=True)
        u = draw(st.lists(unit, min_size=n_mid, max_size=n_mid))
        mid = lo * (hi / lo) ** np.asarray(u, dtype=np.float64)
        # strictly inside (σ_k, σ_1), so the tie counts are exact, and the gap kept after rounding
        mid = np.clip(mid, max(lo, np.nextafter(sk, np.inf)), min(hi, np.nextafter(s1, 0.0)))
        mid = np.sort(mid)[::-1]
    else:
        mid = np.zeros(0)
    values = np.concatenate([np.full(t, s1), mid, np.full(b, sk)])
    return values, t, b


def spectra(
    *,
    rank: IntSpec = (1, 5),
    kappa: FloatSpec = (1.0, 1e3),
    sigma_min: FloatSpec = (0.1, 10.0),
    top_ties: IntSpec = 1,
    bottom_ties: IntSpec = 1,
    gap: float = 0.0,
) -> SearchStrategy[np.ndarray]:
    """Descending nonzero singular values (float64, length ``k``) with exactly known ties.

    ``σ_1 = … = σ_t > σ_{t+1} ≥ … ≥ σ_{k−b} > σ_{k−b+1} = … = σ_k > 0``, the middle log-uniform;
    ``t ≤ k − 1``, ``b ≤ k − t`` are clipped; κ = 1 (``gap == 0``) or ``k = 1``: ``k`` equal values.

    Parameters
    ----------
    rank : int, (low, high) or SearchStrategy
        The rank ``k ≥ 1``.
    kappa : float, (low, high) or SearchStrategy
        ``κ = σ_1/σ_k ≥ 1``.
    sigma_min : float, (low, high) or SearchStrategy
        ``σ_k > 0``.
    top_ties : int, (int, int) or SearchStrategy
        Multiplicity ``t ≥ 1`` of ``σ_1``.
    bottom_ties : int, (int, int) or SearchStrategy
        Multiplicity ``b ≥ 1`` of ``σ_k``.
    gap : float
        ``≥ 0``: the middle values' least relative distance from both ends (κ raised to fit it).

    Raises
    ------
    TypeError, ValueError
        At construction, for malformed arguments (e.g. ``rank < 1``, ``kappa < 1``, ``gap < 0``).

    Examples
    --------
    >>> from condreg.testing.strategies import spectra
    >>> strategy = spectra(rank=3, kappa=10.0, sigma_min=1.0)
    """
    args = _spectrum_args(kappa, sigma_min, top_ties, bottom_ties, gap)
    return _ints(rank, "rank", 1).flatmap(lambda k: _spectrum(k, *args)).map(lambda r: r[0])


class SpectralCase(NamedTuple):
    """A drawn matrix, its zero-padded singular values, rank, exact tie counts and seed;
    ``kappa`` = σ_1/σ_k, ``sigma_min`` = σ_k, ``sigma_max`` = σ_1 (floats, or batch arrays)."""

    matrix: Any
    singular_values: np.ndarray
    m: int
    n: int
    rank: int
    top_ties: Any
    bottom_ties: Any
    seed: int

    @property
    def kappa(self) -> np.ndarray | float:
        return _item(self.singular_values[..., 0] / self.singular_values[..., self.rank - 1])

    @property
    def sigma_min(self) -> np.ndarray | float:
        return _item(self.singular_values[..., self.rank - 1])

    @property
    def sigma_max(self) -> np.ndarray | float:
        return _item(self.singular_values[..., 0])


def _item(out: np.ndarray) -> np.ndarray | float:
    return float(out) if out.ndim == 0 else out


def _shape(spec: Any) -> SearchStrategy:
    if isinstance(spec, SearchStrategy):
        return spec
    if isinstance(spec, Sequence) and all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 1 for d in spec
    ):
        return st.just(tuple(spec))
    raise TypeError(f"batch_shape must be a tuple of positive ints or a strategy, got {spec!r}")


@st.composite
def _case(draw, rank, rows, cols, spectrum_args, batch_shape, xp, dtype, device) -> SpectralCase:
    if rows is None or cols is None:
        k = int(draw(rank))
        m = k + int(draw(st.integers(0, 2))) if rows is None else int(draw(rows))
        n = k + int(draw(st.integers(0, 2))) if cols is None else int(draw(cols))
        k = min(k, m, n)
    else:
        m, n = int(draw(rows)), int(draw(cols))
        k = min(int(draw(rank)), m, n)
    if k < 1:
        raise ValueError(f"rows and cols must be >= 1, got {m}, {n}")
    shape = tuple(int(d) for d in draw(_shape(batch_shape)))
    count = int(np.prod(shape)) if shape else 1
    kappa, sigma_min, top_ties, bottom_ties, gap = spectrum_args
    # one tie pattern per case; each matrix of a batch draws its own κ, σ_k and middle values
    t, b = int(draw(top_ties)), int(draw(bottom_ties))
    rows_of_values, ties = [], []
    for _ in range(count):
        v, t_eff, b_eff = draw(_spectrum(k, kappa, sigma_min, st.just(t), st.just(b), gap))
        rows_of_values.append(v)
        ties.append((t_eff, b_eff))
    seed = int(draw(st.integers(0, 2**32 - 1)))
    p = min(m, n)
    values = np.zeros((count, p))
    values[:, :k] = np.stack(rows_of_values)
    dt = draw(dtype) if isinstance(dtype, SearchStrategy) else dtype
    S = values[0] if not shape else values
    out = matrix_with_spectrum(S, m, n, seed=seed, xp=xp, dtype=dt, device=device)
    if len(shape) > 1:
        out = (np if xp is None else xp).reshape(out, shape + (m, n))
    if shape:
        tie_arr = np.asarray(ties, dtype=np.int64).reshape(shape + (2,))
        t_out, b_out = tie_arr[..., 0], tie_arr[..., 1]
    else:
        t_out, b_out = ties[0]
    return SpectralCase(out, values.reshape(shape + (p,)), m, n, k, t_out, b_out, seed)


def spectral_cases(
    *,
    rank: IntSpec = (1, 5),
    kappa: FloatSpec = (1.0, 1e3),
    sigma_min: FloatSpec = (0.1, 10.0),
    top_ties: IntSpec = 1,
    bottom_ties: IntSpec = 1,
    gap: float = 0.0,
    rows: IntSpec | None = None,
    cols: IntSpec | None = None,
    batch_shape: tuple[int, ...] | SearchStrategy = (),
    xp: Any = None,
    dtype: Any = None,
    device: Any = None,
) -> SearchStrategy[SpectralCase]:
    """:class:`SpectralCase` draws: a matrix ``U diag(s) Vᵀ`` with the spectrum of :func:`spectra`.

    A batch shares ``m``, ``n``, ``k`` and the tie pattern, not κ, ``σ_k`` or the factors.

    Parameters
    ----------
    rank : int, (low, high) or SearchStrategy
        As in :func:`spectra`.
    kappa : float, (low, high) or SearchStrategy
        As in :func:`spectra`.
    sigma_min : float, (low, high) or SearchStrategy
        As in :func:`spectra`.
    top_ties : int, (int, int) or SearchStrategy
        As in :func:`spectra`.
    bottom_ties : int, (int, int) or SearchStrategy
        As in :func:`spectra`.
    gap : float
        As in :func:`spectra`.
    rows, cols : int, (int, int) or SearchStrategy, optional
        ``m`` and ``n`` (the rank clipped to ``min(m, n)``); default ``k + 0…2`` each.
    batch_shape : tuple of int or SearchStrategy
        ``()`` (default) for one matrix.
    xp, dtype, device : optional
        Convert with ``xp.asarray(S, dtype=dtype, device=device)``; ``dtype`` may be a strategy.

    Raises
    ------
    TypeError, ValueError
        At construction, for malformed arguments (e.g. a negative rank, ``kappa < 1``).

    Examples
    --------
    >>> from condreg.testing.strategies import spectral_cases
    >>> strategy = spectral_cases(rank=(2, 4), kappa=(1.0, 100.0), batch_shape=(3,))
    """
    spectrum_args = _spectrum_args(kappa, sigma_min, top_ties, bottom_ties, gap)
    rank = _ints(rank, "rank", 1)
    rows = None if rows is None else _ints(rows, "rows", 1)
    cols = None if cols is None else _ints(cols, "cols", 1)
    return _case(rank, rows, cols, spectrum_args, _shape(batch_shape), xp, dtype, device)


def matrices(**kwargs: Any) -> SearchStrategy[Any]:
    """The matrices of :func:`spectral_cases` alone.

    Parameters
    ----------
    **kwargs
        The keyword arguments of :func:`spectral_cases`.

    Raises
    ------
    TypeError, ValueError
        As :func:`spectral_cases`.

    Examples
    --------
    >>> from condreg.testing.strategies import matrices
    >>> strategy = matrices(rank=2, rows=3, cols=3)
    """
    return spectral_cases(**kwargs).map(lambda case: case.matrix)
