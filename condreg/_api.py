"""The public condition-number functions: validate → decompose → value (or gradient).

Each takes a real floating array ``S`` of shape ``(..., m, n)`` from any Array API library; the
leading axes are a batch. Values have shape ``S.shape[:-2]``, gradients ``S.shape``; namespace,
dtype and device are the input's. On PyTorch tensors and JAX arrays the value functions are
differentiable natively (:mod:`condreg.torch`, :mod:`condreg.jax`) with these closed forms as
their backward. With ``gram=True`` the engine takes the eigh of the smaller Gram matrix where it
resolves every counted singular value, and a QR of ``F`` with the SVD of its ``R`` otherwise.
"""

from __future__ import annotations

from typing import Any

from condreg import _backend, _core, _spectrum, _validation

Array = Any

__all__ = [
    "condition_number",
    "r_well",
    "r_ill",
    "condition_number_grad",
    "r_well_grad",
    "r_ill_grad",
]


def _prepared(S: Any, where: str, gram: Any, check: Any, xp: Any, dtype: Any) -> tuple:
    """``(S, xp, out_dtype, gram, check)``: the flags checked, ``S`` validated (the value checks
    are the engine's, on its one read) and in its compute dtype."""
    gram = _validation.flag(gram, "gram", where)
    check = _validation.flag(check, "check_finite", where)
    S, xp, _ = _validation.matrix(S, xp=xp, where=where, check_finite=False)
    S, out_dtype = _validation.compute_dtype(S, xp, dtype, where=where)
    return S, xp, out_dtype, gram, check


def _value(
    quantity: str,
    S: Any,
    rtol: float | None,
    tie_rtol: float | None,
    gram: bool,
    check_finite: bool,
    xp: Any,
    compute_dtype: Any,
) -> Array:
    """validate → evaluate: the one route of every value function (through the array's
    differentiable adapter, :mod:`condreg.torch` or :mod:`condreg.jax`, whose forward is the same
    call; this delegation is the one place that picks it, the engine never looks one up)."""
    S, xp, out_dtype, gram, check = _prepared(S, quantity, gram, check_finite, xp, compute_dtype)
    kw = {"rtol": rtol, "tie_rtol": tie_rtol, "gram": gram, "check": check}
    lib = _backend.library(S)
    if lib == "torch":
        from condreg.torch import value as adapted
    elif lib == "jax":
        from condreg.jax import value as adapted
    else:
        out = _spectrum.evaluate(quantity, S, xp, vectors=False, **kw).value
        return out if out.dtype == out_dtype else xp.astype(out, out_dtype)
    out = adapted(quantity, S, **kw)
    return out if out.dtype == out_dtype else xp.astype(out, out_dtype)


def _grad(
    quantity: str,
    S: Any,
    rtol: float | None,
    tie_rtol: float | None,
    gram: bool,
    subgradient: str,
    check_finite: bool,
    xp: Any,
    compute_dtype: Any,
) -> Array:
    """validate → evaluate → assemble: the closed-form gradient."""
    where = quantity + "_grad"
    S, xp, out_dtype, gram, check = _prepared(S, where, gram, check_finite, xp, compute_dtype)
    kw = {"rtol": rtol, "tie_rtol": tie_rtol, "gram": gram, "policy": subgradient}
    ev = _spectrum.evaluate(quantity, S, xp, vectors=True, check=check, where=where, **kw)
    _core.check_pole(ev.pole)  # read where checks are on
    out = _spectrum.assemble(ev, xp)
    return out if out.dtype == out_dtype else xp.astype(out, out_dtype)


def condition_number(
    S: Array,
    *,
    rtol: float | None = None,
    gram: bool = False,
    check_finite: bool = True,
    xp: Any = None,
    compute_dtype: Any = None,
) -> Array:
    """Condition number over the nonzero singular values (Eq. 1):
    ``kappa(S) = sigma_1 / sigma_k``, ``k = #{i : sigma_i > rtol·sigma_1}``.

    ``k`` is the numerical rank, so ``kappa = ‖S‖₂ ‖S⁺‖₂`` and a rank-deficient matrix has a
    finite condition number. With ``gram=True`` it is ``kappa(FᵀF) = kappa(F)**2``; always
    ``kappa >= 1``.

    Parameters
    ----------
    S : array_like, shape (..., m, n)
        A real matrix or batch of any Array API library, or nested lists (``gram=True``: ``F``,
        ``(..., N, D)``; tokens ``(B, T, D)`` are B matrices of T rows).
    rtol : float, optional
        Rank tolerance: ``sigma_i > rtol·sigma_1`` counts (default ``max(m, n)·eps``).
    gram : bool, default False
        The quantity of ``H = FᵀF`` for a feature batch ``F`` (gradients with respect to ``F``).
    check_finite : bool, default True
        Check for NaN/Inf and the zero matrix (skipped under tracing); unchecked, they give NaN.
    xp : namespace, optional
        Array API namespace to use instead of the one inferred from ``S``.
    compute_dtype : dtype, optional
        Dtype to compute in (default float32 for float16/bfloat16); results in the input's.

    Returns
    -------
    array, shape S.shape[:-2]
        The value in the input's namespace, dtype and device (differentiable on PyTorch, JAX).

    Raises
    ------
    TypeError
        Not a numeric array(-like), a masked array, a non-bool flag, a dtype other than
        float16/bfloat16/float32/float64 (integers are promoted), a foreign ``compute_dtype``,
        a non-real ``rtol``.
    ValueError
        ``ndim < 2``, an empty matrix, NaN/Inf entries, ``rtol`` outside ``[0, 1)``.
    RankError
        A zero matrix (numerical rank 0).

    Examples
    --------
    >>> import numpy as np, condreg
    >>> float(condreg.condition_number(np.diag([4.0, 2.0, 1.0])))
    4.0
    >>> float(condreg.condition_number(np.diag([4.0, 2.0]), gram=True))  # κ(FᵀF) = κ(F)²
    4.0
    """
    return _value("condition_number", S, rtol, None, gram, check_finite, xp, compute_dtype)


def r_well(
    S: Array,
    *,
    gram: bool = False,
    check_finite: bool = True,
    xp: Any = None,
    compute_dtype: Any = None,
) -> Array:
    """R_well, the well-conditioning regularizer (Eq. 3, Nenov et al.):
    ``R_well(S) = ½ sigma_1² − ‖S‖_F² / (2p)``, ``p = min(m, n)``.

    Non-negative, zero iff ``S`` has full rank and ``kappa = 1``; minimising it makes ``S``
    well-conditioned. With ``gram=True`` it is R_well of ``H = FᵀF`` with ``p = D``.

    Parameters
    ----------
    S : array_like, shape (..., m, n)
        A real matrix or batch of any Array API library, or nested lists (``gram=True``: ``F``,
        ``(..., N, D)``; tokens ``(B, T, D)`` are B matrices of T rows).
    gram : bool, default False
        The quantity of ``H = FᵀF`` for a feature batch ``F`` (gradients with respect to ``F``).
    check_finite : bool, default True
        Check for NaN/Inf and the zero matrix (skipped under tracing); unchecked, they give NaN.
    xp : namespace, optional
        Array API namespace to use instead of the one inferred from ``S``.
    compute_dtype : dtype, optional
        Dtype to compute in (default float32 for float16/bfloat16); results in the input's.

    Returns
    -------
    array, shape S.shape[:-2]
        The value in the input's namespace, dtype and device (differentiable on PyTorch, JAX).

    Raises
    ------
    TypeError
        Not a numeric array(-like), a masked array, a non-bool flag, a dtype other than
        float16/bfloat16/float32/float64 (integers are promoted), a foreign ``compute_dtype``.
    ValueError
        ``ndim < 2``, an empty matrix, NaN/Inf entries.
    RankError
        A zero matrix (numerical rank 0).

    Examples
    --------
    >>> import numpy as np, condreg
    >>> float(condreg.r_well(np.diag([2.0, 1.0])))  # ½·4 − (4 + 1)/4
    0.75
    >>> float(condreg.r_well(np.eye(3)))  # zero iff full rank and κ = 1
    0.0
    """
    return _value("r_well", S, None, None, gram, check_finite, xp, compute_dtype)


def r_ill(
    S: Array,
    *,
    rtol: float | None = None,
    tie_rtol: float | None = None,
    gram: bool = False,
    check_finite: bool = True,
    xp: Any = None,
    compute_dtype: Any = None,
) -> Array:
    """R_ill, the ill-conditioning regularizer (Eq. 12):
    ``R_ill(S) = 1 / (‖S‖_F² / (2k) − ½ sigma_k²)``, ``k`` the numerical rank.

    Non-negative; at fixed ``sigma_k`` it tends to 0 iff ``kappa -> inf`` (Theorem 4.1).
    Minimising it makes ``S`` ill-conditioned. At its pole — all nonzero singular values equal
    within ``tie_rtol`` (``kappa = 1``, any rank-1 matrix) — the value is ``+inf``. The
    denominator is evaluated as ``Σ_{i≤k} (sigma_i² − sigma_k²) / (2k)``, exact and never
    negative. With ``gram=True`` it is R_ill of ``H = FᵀF``.

    Parameters
    ----------
    S : array_like, shape (..., m, n)
        A real matrix or batch of any Array API library, or nested lists (``gram=True``: ``F``,
        ``(..., N, D)``; tokens ``(B, T, D)`` are B matrices of T rows).
    rtol : float, optional
        Rank tolerance: ``sigma_i > rtol·sigma_1`` counts (default ``max(m, n)·eps``).
    tie_rtol : float, optional
        Tie tolerance relative to ``sigma_1`` (default ``32 * sqrt(max(m, n)) * eps``).
    gram : bool, default False
        The quantity of ``H = FᵀF`` for a feature batch ``F`` (gradients with respect to ``F``).
    check_finite : bool, default True
        Check for NaN/Inf and the zero matrix (skipped under tracing); unchecked, they give NaN.
    xp : namespace, optional
        Array API namespace to use instead of the one inferred from ``S``.
    compute_dtype : dtype, optional
        Dtype to compute in (default float32 for float16/bfloat16); results in the input's.

    Returns
    -------
    array, shape S.shape[:-2]
        The value in the input's namespace, dtype and device (differentiable on PyTorch, JAX).

    Raises
    ------
    TypeError
        Not a numeric array(-like), a masked array, a non-bool flag, a dtype other than
        float16/bfloat16/float32/float64 (integers are promoted), a foreign ``compute_dtype``,
        a non-real ``rtol``/``tie_rtol``.
    ValueError
        ``ndim < 2``, an empty matrix, NaN/Inf entries, ``rtol``/``tie_rtol`` outside ``[0, 1)``.
    RankError
        A zero matrix (numerical rank 0).

    Examples
    --------
    >>> import numpy as np, condreg
    >>> float(condreg.r_ill(np.diag([2.0, 1.0])))  # 1 / ((4 + 1)/4 − ½)
    1.3333333333333333
    >>> float(condreg.r_ill(np.eye(3)))  # the pole: all nonzero singular values equal
    inf
    """
    return _value("r_ill", S, rtol, tie_rtol, gram, check_finite, xp, compute_dtype)


def condition_number_grad(
    S: Array,
    *,
    rtol: float | None = None,
    subgradient: str = "min_norm",
    tie_rtol: float | None = None,
    gram: bool = False,
    check_finite: bool = True,
    xp: Any = None,
    compute_dtype: Any = None,
) -> Array:
    """Closed-form (sub)gradient of the condition number:
    ``∇kappa = u_1 v_1ᵀ / sigma_k − (sigma_1 / sigma_k²) u_k v_kᵀ``.

    At tied extremes each rank-one term is replaced according to ``subgradient``. With
    ``gram=True``: the gradient of ``kappa(FᵀF)`` with respect to ``F``.

    Parameters
    ----------
    S : array_like, shape (..., m, n)
        A real matrix or batch of any Array API library, or nested lists (``gram=True``: ``F``,
        ``(..., N, D)``; tokens ``(B, T, D)`` are B matrices of T rows).
    rtol : float, optional
        Rank tolerance: ``sigma_i > rtol·sigma_1`` counts (default ``max(m, n)·eps``).
    subgradient : {"min_norm", "any", "raise"}, default "min_norm"
        At a tied extreme: average the tied rank-one terms (the minimum-norm subgradient), use
        the pair the decomposition put first (``"any"``), or raise :class:`TiedExtremeError`.
    tie_rtol : float, optional
        Tie tolerance relative to ``sigma_1`` (default ``32 * sqrt(max(m, n)) * eps``).
    gram : bool, default False
        The quantity of ``H = FᵀF`` for a feature batch ``F`` (gradients with respect to ``F``).
    check_finite : bool, default True
        Check for NaN/Inf and the zero matrix (skipped under tracing); unchecked, they give NaN.
    xp : namespace, optional
        Array API namespace to use instead of the one inferred from ``S``.
    compute_dtype : dtype, optional
        Dtype to compute in (default float32 for float16/bfloat16); results in the input's.

    Returns
    -------
    array, shape S.shape
        The (sub)gradient with respect to ``S`` (or ``F``), in the input's namespace and dtype.

    Raises
    ------
    TypeError
        Not a numeric array(-like), a masked array, a non-bool flag, a dtype other than
        float16/bfloat16/float32/float64 (integers are promoted), a foreign ``compute_dtype``,
        a non-real ``rtol``/``tie_rtol``.
    ValueError
        ``ndim < 2``, an empty matrix, NaN/Inf entries, ``rtol``/``tie_rtol`` outside ``[0, 1)``.
    RankError
        A zero matrix (numerical rank 0).
    TiedExtremeError
        A tied extreme under ``subgradient="raise"``.

    Examples
    --------
    >>> import numpy as np, condreg
    >>> condreg.condition_number_grad(np.diag([4.0, 2.0, 1.0]))
    array([[ 1.,  0.,  0.],
           [ 0.,  0.,  0.],
           [ 0.,  0., -4.]])
    """
    args = (rtol, tie_rtol, gram, subgradient, check_finite, xp, compute_dtype)
    return _grad("condition_number", S, *args)


def r_well_grad(
    S: Array,
    *,
    subgradient: str = "min_norm",
    tie_rtol: float | None = None,
    gram: bool = False,
    check_finite: bool = True,
    xp: Any = None,
    compute_dtype: Any = None,
) -> Array:
    """Closed-form (sub)gradient of R_well (Theorem A.1):
    ``∇R_well = sigma_1 u_1 v_1ᵀ − S / p``.

    At a tied ``sigma_1`` (multiplicity r) the default uses ``(sigma_1 / r) U_J V_Jᵀ``, the
    minimum-norm subgradient. With ``gram=True``: ``2F (lambda_1 v_1v_1ᵀ − H / D)`` with
    respect to ``F``.

    Parameters
    ----------
    S : array_like, shape (..., m, n)
        A real matrix or batch of any Array API library, or nested lists (``gram=True``: ``F``,
        ``(..., N, D)``; tokens ``(B, T, D)`` are B matrices of T rows).
    subgradient : {"min_norm", "any", "raise"}, default "min_norm"
        At a tied extreme: average the tied rank-one terms (the minimum-norm subgradient), use
        the pair the decomposition put first (``"any"``), or raise :class:`TiedExtremeError`.
    tie_rtol : float, optional
        Tie tolerance relative to ``sigma_1`` (default ``32 * sqrt(max(m, n)) * eps``).
    gram : bool, default False
        The quantity of ``H = FᵀF`` for a feature batch ``F`` (gradients with respect to ``F``).
    check_finite : bool, default True
        Check for NaN/Inf and the zero matrix (skipped under tracing); unchecked, they give NaN.
    xp : namespace, optional
        Array API namespace to use instead of the one inferred from ``S``.
    compute_dtype : dtype, optional
        Dtype to compute in (default float32 for float16/bfloat16); results in the input's.

    Returns
    -------
    array, shape S.shape
        The (sub)gradient with respect to ``S`` (or ``F``), in the input's namespace and dtype.

    Raises
    ------
    TypeError
        Not a numeric array(-like), a masked array, a non-bool flag, a dtype other than
        float16/bfloat16/float32/float64 (integers are promoted), a foreign ``compute_dtype``,
        a non-real ``tie_rtol``.
    ValueError
        ``ndim < 2``, an empty matrix, NaN/Inf entries, ``tie_rtol`` outside ``[0, 1)``.
    RankError
        A zero matrix (numerical rank 0).
    TiedExtremeError
        A tied extreme under ``subgradient="raise"``.

    Examples
    --------
    >>> import numpy as np, condreg
    >>> condreg.r_well_grad(np.diag([2.0, 1.0]))
    array([[ 1. ,  0. ],
           [ 0. , -0.5]])
    """
    return _grad("r_well", S, None, tie_rtol, gram, subgradient, check_finite, xp, compute_dtype)


def r_ill_grad(
    S: Array,
    *,
    rtol: float | None = None,
    subgradient: str = "min_norm",
    tie_rtol: float | None = None,
    gram: bool = False,
    check_finite: bool = True,
    xp: Any = None,
    compute_dtype: Any = None,
) -> Array:
    """Closed-form (sub)gradient of R_ill (Eq. 13):
    ``∇R_ill = (sigma_k u_k v_kᵀ − S / k) / (‖S‖_F² / (2k) − ½ sigma_k²)²``.

    At a tied ``sigma_k`` the default averages the tied rank-one terms (minimum norm). With
    ``gram=True``: ``2F (lambda_k v_kv_kᵀ − H/k) / den²`` with respect to ``F``.

    Parameters
    ----------
    S : array_like, shape (..., m, n)
        A real matrix or batch of any Array API library, or nested lists (``gram=True``: ``F``,
        ``(..., N, D)``; tokens ``(B, T, D)`` are B matrices of T rows).
    rtol : float, optional
        Rank tolerance: ``sigma_i > rtol·sigma_1`` counts (default ``max(m, n)·eps``).
    subgradient : {"min_norm", "any", "raise"}, default "min_norm"
        At a tied extreme: average the tied rank-one terms (the minimum-norm subgradient), use
        the pair the decomposition put first (``"any"``), or raise :class:`TiedExtremeError`.
    tie_rtol : float, optional
        Tie tolerance relative to ``sigma_1`` (default ``32 * sqrt(max(m, n)) * eps``).
    gram : bool, default False
        The quantity of ``H = FᵀF`` for a feature batch ``F`` (gradients with respect to ``F``).
    check_finite : bool, default True
        Check for NaN/Inf and the zero matrix (skipped under tracing); unchecked, they give NaN.
    xp : namespace, optional
        Array API namespace to use instead of the one inferred from ``S``.
    compute_dtype : dtype, optional
        Dtype to compute in (default float32 for float16/bfloat16); results in the input's.

    Returns
    -------
    array, shape S.shape
        The (sub)gradient with respect to ``S`` (or ``F``), in the input's namespace and dtype.

    Raises
    ------
    TypeError
        Not a numeric array(-like), a masked array, a non-bool flag, a dtype other than
        float16/bfloat16/float32/float64 (integers are promoted), a foreign ``compute_dtype``,
        a non-real ``rtol``/``tie_rtol``.
    ValueError
        ``ndim < 2``, an empty matrix, NaN/Inf entries, ``rtol``/``tie_rtol`` outside ``[0, 1)``.
    RankError
        A zero matrix (numerical rank 0).
    TiedExtremeError
        A tied extreme under ``subgradient="raise"``.
    PoleError
        At the pole (all nonzero singular values equal, including rank 1), where R_ill is
        ``+inf``.

    Examples
    --------
    >>> import numpy as np, condreg
    >>> condreg.r_ill_grad(np.diag([2.0, 1.0])) * 0.5625  # den² = (3/4)²
    array([[-1. ,  0. ],
           [ 0. ,  0.5]])
    """
    return _grad("r_ill", S, rtol, tie_rtol, gram, subgradient, check_finite, xp, compute_dtype)
