"""The left preconditioner ``K⁻¹`` of Algorithm 1 (the paper's "dummy layer"): one home, one rule.

Algorithm 1 multiplies each regularizer gradient by ``K⁻¹`` on the left, ``K = XᵀX`` (docs/math.md
§5). ``K`` is often singular, so condreg uses, from the thin SVD ``X = U diag(s) Vᵀ``, either the
pseudo-inverse (``ridge=None``: ``K⁺K = V_r V_rᵀ``) or the ridge inverse (``ridge=ε``:
``V diag(s²/(s² + ε·s₁²)) Vᵀ``), acting on ``∇_θ f = 2KθG`` as ``V diag(f) Vᵀ·2θG``. Rank rule as
everywhere: ``s_i > rtol·s₁``, default ``rtol = max(N, D)·eps``. The "dummy layer" applies the
same operator on the sample axis (:func:`sample_preconditioner`: ``U diag(1/(s² + ε·s₁²)) Uᵀ``).
Pure Array API code, no host synchronisation, no data-dependent shapes.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from condreg import _core, _spectrum

Array = Any

__all__ = [
    "LeftPreconditioner",
    "left_preconditioner",
    "sample_preconditioner",
    "left_filter",
    "rank_mask",
]


def rank_mask(s: Array, rtol: float) -> Array:
    """``s_i > rtol·s₁`` for descending singular values ``s`` (boolean array, same shape)."""
    return s > rtol * s[..., :1]


class LeftPreconditioner(NamedTuple):
    """``M ↦ V diag(f) Vᵀ M``: the pseudo-inverse projection ``K⁺K`` or the ridge filter.

    ``basis`` is ``V`` (``D×m``, right singular vectors of ``X``), ``s`` the singular values
    (``m``, descending), ``filter`` the ``f_i`` (``m``; 0 beyond the numerical rank)."""

    basis: Array
    s: Array
    filter: Array

    def apply(self, M: Array) -> Array:
        """Left-multiply ``M`` (``D×…``) by ``V diag(f) Vᵀ``."""
        return self.basis @ (self.filter[:, None] * (self.basis.T @ M))


def left_filter(s: Array, mask: Array, ridge: float | None, xp: Any) -> Array:
    """``f_i``: 1 (pseudo-inverse) or ``s_i²/(s_i² + ridge·s₁²)`` on the rank, 0 beyond it."""
    keep = xp.astype(mask, s.dtype)
    if ridge is None:
        return keep
    s2 = s * s
    den = xp.where(mask, s2 + ridge * s2[..., :1], xp.ones_like(s2))  # no 0/0 for X = 0
    return keep * s2 / den


def left_preconditioner(
    X: Array, *, ridge: float | None = None, rtol: float | None = None, xp: Any = None
) -> LeftPreconditioner:
    """The left preconditioner of ``K = XᵀX`` for data ``X`` (``N×D``; see the module docs).

    ``ridge=None``: ``K⁺K`` (projection onto the row space of ``X``); ``ridge=ε``:
    ``(K + ε·λ_max(K)·I)⁻¹K``. ``rtol`` is the rank rule on the singular values of ``X``
    (default ``max(N, D)·eps``). One thin SVD of ``X``; jit-able.

    ``TypeError`` for a ``ridge`` or ``rtol`` that is not a real number, ``ValueError`` for a
    ``ridge`` below 0 (0: the pseudo-inverse, as ``None``) or an ``rtol`` outside ``[0, 1)``.
    """
    if xp is None:
        from array_api_compat import array_namespace

        xp = array_namespace(X)
    ridge = _core.check_ridge(ridge)
    tol = _spectrum.resolve_rtol(rtol, X.shape, X.dtype, xp)
    _, s, Vh = xp.linalg.svd(X, full_matrices=False)
    f = left_filter(s, rank_mask(s, tol), ridge or None, xp)
    return LeftPreconditioner(Vh.T, s, f)


def sample_preconditioner(
    x: Array, *, ridge: float = 0.0, rtol: float | None = None, xp: Any = None
) -> LeftPreconditioner:
    """The dummy layer's backward ``ḡ ↦ (xxᵀ + ε I)⁻¹ḡ`` (``N×N``, on the sample axis) for a
    batch ``x`` (``N×D``), ``ε = ridge·s₁²`` (``ridge=0``: the pseudo-inverse ``(xxᵀ)⁺``), with
    the module's rank rule (``s_i > rtol·s₁``, default ``max(N, D)·eps``). ``apply(ḡ)`` computes
    ``U diag(f) Uᵀ ḡ`` with ``f_i = 1/(s_i² + ε)`` on the rank, 0 beyond it. Pure; jit-able.

    ``TypeError`` for a ``ridge`` or ``rtol`` that is not a real number, ``ValueError`` for
    ``ridge < 0`` or an ``rtol`` outside ``[0, 1)``."""
    if xp is None:
        from array_api_compat import array_namespace

        xp = array_namespace(x)
    ridge = _core.check_ridge(ridge) or 0.0
    tol = _spectrum.resolve_rtol(rtol, x.shape, x.dtype, xp)
    U, s, _ = xp.linalg.svd(x, full_matrices=False)
    mask = rank_mask(s, tol)
    s2 = s * s
    den = xp.where(mask, s2 + ridge * s2[..., :1], xp.ones_like(s2))
    f = xp.where(mask, 1.0 / den, xp.zeros_like(s2))
    return LeftPreconditioner(U, s, f)
