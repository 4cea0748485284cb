"""The K⁻¹-left-preconditioned regularizer gradient on its own (Theorem 4.3)."""

from __future__ import annotations

from typing import Any

from array_api_compat import array_namespace

from condreg import _core, _precondition, _spectrum

Array = Any


def preconditioned_gradient(
    theta: Array,
    X: Array,
    quantity: str = "r_well",
    *,
    ridge: float | None = None,
    rtol: float | None = None,
    xp: Any = None,
) -> Array:
    """``K⁻¹∇_θ f(H(θ))`` with ``K⁻¹`` on the **left**: ``H(θ) = θᵀKθ``, ``K = XᵀX``.

    ``= 2θG`` (``G = ∇_H f``) for invertible ``K``, else ``K⁺K·2θG`` or, with ``ridge=ε``,
    ``(K + ε·λ_max(K)·I)⁻¹K·2θG`` (Theorem 4.3). Pure Array API code: it traces under ``jax.jit``.

    Parameters
    ----------
    theta, X : array, shape (D, D_out) and (N, D)
        The extractor and the task's data.
    quantity : {"r_well", "r_ill", "condition_number"}
        The regularizer ``f``.
    ridge : float > 0, optional
        ``None``: the pseudo-inverse; ``ε``: ``(K + ε·λ_max(K)·I)⁻¹``.
    rtol : float, optional
        Rank tolerance on the singular values of ``Xθ`` and ``X``; default ``max(N, D)·eps``.
    xp : namespace, optional
        Array API namespace to use instead of the arrays'.

    Returns
    -------
    array, shape (D, D_out)
        ``K⁻¹∇_θ f(H(θ))`` in the arrays' namespace.

    Raises
    ------
    ValueError
        An unknown ``quantity``.
    TypeError
        ``theta`` and ``X`` of different libraries.

    Examples
    --------
    >>> import numpy as np
    >>> from condreg.algorithm import preconditioned_gradient
    >>> X = np.random.default_rng(0).standard_normal((20, 4))
    >>> preconditioned_gradient(np.eye(4), X, "r_well").shape
    (4, 4)
    """
    if quantity not in _core.QUANTITIES:
        raise ValueError(f"quantity must be one of {_core.QUANTITIES}, got {quantity!r}")
    if xp is None:
        try:
            xp = array_namespace(theta, X)
        except TypeError:
            raise TypeError(
                "preconditioned_gradient: theta and X must be arrays of one Array API library"
            ) from None
    F = X @ theta
    sp = _spectrum.decompose(
        F, xp, gram=True, vectors=True, rtol=rtol, concrete=_core.never, method="svd"
    )
    tie = _core.default_tie_rtol(F.shape, F.dtype, xp)
    # scale-free, as the core's gradients: an over- or underflowing result is ±inf or 0, not NaN
    unit, s1 = _core.normalized(sp, xp)
    d = _core.DMU[quantity](unit, tie, "min_norm", xp, _core.never)
    step = 2.0 * (theta @ ((sp.Vh.T * d[None, :]) @ sp.Vh))
    step = _core.rescale(step, s1, 2 * _core.DEGREE[quantity], xp)
    return _precondition.left_preconditioner(X, ridge=ridge, rtol=rtol, xp=xp).apply(step)
