"""The public condition-number functions.

Each takes a real floating array ``S`` of shape ``(..., m, n)`` from any Array API library; the
leading axes are a batch. Values have shape ``S.shape[:-2]``, gradients ``S.shape``; namespace,
dtype and device are the input's. On PyTorch tensors and JAX arrays the value functions are
differentiable natively (:mod:`condreg.torch`, :mod:`condreg.jax`), with these closed forms as
their backward.

Common keyword arguments
------------------------
rtol : float, optional
    Rank tolerance: singular values ``sigma_i > rtol * sigma_1`` count as nonzero. Default
    ``max(m, n) * eps(dtype)``. With ``gram=True`` it applies to the singular values of ``F``
    (rank(FᵀF) = rank(F); equivalently ``rtol**2`` on the eigenvalues of ``H``).
tie_rtol : float, optional
    Singular values within ``tie_rtol * sigma_1`` of an extreme one are tied with it (with
    ``gram=True``: ``|mu_i - mu_e| <= tie_rtol * sigma_1 * (sigma_i + sigma_e)`` on the eigenvalues
    of H). Default ``32 * sqrt(max(m, n)) * eps`` of the dtype the spectrum was computed in: equal
    up to rounding (docs/math.md §10.1).
gram : bool
    If True, the argument is a feature matrix ``F`` of shape ``(..., N, D)`` and the quantity is
    that of the Gram matrix ``H = FᵀF`` (``D×D``, the probing Hessian); gradients are with
    respect to ``F``. The spectral engine picks the cheapest exact path: the eigh of the smaller
    Gram (``N×N`` when ``N < D``, ``D×D`` otherwise) where it resolves every singular value the
    rank rule counts, a QR of ``F`` and the SVD of its small ``R`` otherwise (docs/api.md).
subgradient : {"min_norm", "any", "raise"}
    At a tied extreme singular value: ``"min_norm"`` (default) averages the tied rank-one terms,
    the minimum-norm element of the subdifferential; ``"any"`` uses the one singular pair the
    decomposition put at the extreme position; ``"raise"`` raises :class:`TiedExtremeError`.
check_finite : bool
    Check (eagerly) that the input is finite, that it is not the zero matrix and, for gradients,
    that R_ill is not at its pole. On a GPU each check costs a host synchronisation;
    ``check_finite=False`` skips them all; invalid input then gives NaN/inf results (or the
    backend's own error, e.g. NumPy's ``LinAlgError`` for an SVD of NaNs). Under tracing
    (``jax.jit``, ``torch.compile``, ``torch.func.vmap``) the checks are skipped automatically
    without breaking the trace.
xp : namespace, optional
    Array API namespace to use instead of the one inferred from ``S``.
compute_dtype : dtype, optional
    The dtype to compute in. Default: float32 for float16/bfloat16 input, the input's dtype
    otherwise. Values and gradients are returned in the input dtype.

Raises (all functions)
----------------------
TypeError
    Not an array, boolean or complex dtype, a namespace without ``linalg``, or a
    ``compute_dtype`` that is not a real floating dtype.
ValueError
    ``ndim < 2``, an empty matrix, NaN/Inf entries; :class:`RankError` (a ``ValueError``) for a
    zero matrix (rank 0). Integer input is promoted to the namespace's default real floating
    dtype, like ``numpy.linalg``.
"""

from __future__ import annotations

import sys
from typing import Any

from array_api_compat import is_jax_array, is_torch_array

from condreg import _core, _validation

Array = Any

__all__ = [
    "condition_number",
    "r_well",
    "r_ill",
    "condition_number_grad",
    "r_well_grad",
    "r_ill_grad",
]


def _value(
    quantity: str,
    S: Array,
    *,
    rtol: float | None,
    tie_rtol: float | None,
    gram: bool,
    check_finite: bool,
    xp: Any,
    compute_dtype: Any = None,
) -> Array:
    if gram and check_finite and xp is None and compute_dtype is None and _eager_torch(S):
        # The most common deep-learning call (a CPU feature batch, a gradient asked for): the
        # adapter validates it itself (its eligibility implies every check of
        # _validation.matrix but finiteness, which it reads off the Gram matrix it forms).
        from condreg import torch as adapter

        return adapter.eager_host_value(quantity, S, rtol=rtol, tie_rtol=tie_rtol)
    S, xp, concrete = _validation.matrix(S, xp=xp, where=quantity, check_finite=check_finite)
    S, out_dtype = _validation.compute_dtype(S, xp, compute_dtype, where=quantity)
    if is_torch_array(S):
        from condreg import torch as adapter
    elif is_jax_array(S):
        from condreg import jax as adapter
    else:
        out = _core.value(
            quantity, S, xp, rtol=rtol, tie_rtol=tie_rtol, gram=gram, concrete=concrete
        )
        return _validation.as_output(xp.asarray(out), out_dtype, xp)
    out = adapter.value(quantity, S, rtol=rtol, tie_rtol=tie_rtol, gram=gram, check=check_finite)
    return _validation.as_output(out, out_dtype, xp)


def _eager_torch(S: Any) -> bool:
    """Whether ``S`` takes the PyTorch adapter's eager host path (:func:`condreg.torch.eager_host`;
    False without PyTorch loaded)."""
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(S, torch.Tensor):
        return False
    from condreg import torch as adapter

    return adapter.eager_host(S)


def _grad(
    quantity: str,
    S: Array,
    *,
    rtol: float | None,
    tie_rtol: float | None,
    gram: bool,
    subgradient: str,
    check_finite: bool,
    xp: Any,
    compute_dtype: Any = None,
) -> Array:
    where = quantity + "_grad"
    S, xp, concrete = _validation.matrix(S, xp=xp, where=where, check_finite=check_finite)
    S, out_dtype = _validation.compute_dtype(S, xp, compute_dtype, where=where)
    G = _core.gradient(
        quantity,
        S,
        xp,
        rtol=rtol,
        tie_rtol=tie_rtol,
        gram=gram,
        subgradient=subgradient,
        concrete=concrete,
    )
    return _validation.as_output(G, out_dtype, xp)


def condition_number(
    S: Array,
    *,
    rtol: float | None = None,
    gram: bool = False,
    check_finite: bool = True,
    xp: Any = None,
    compute_dtype: Any = None,
) -> Array:
    """Condition number over the nonzero singular values, ``kappa = sigma_1 / sigma_k`` (Eq. 1).

    ``k`` is the numerical rank (``sigma_i > rtol * sigma_1``), so ``kappa = ‖S‖₂ ‖S⁺‖₂`` and a
    rank-deficient matrix has a finite condition number. With ``gram=True``,
    ``kappa(FᵀF) = kappa(F)**2``. Shape ``S.shape[:-2]``; ``kappa >= 1``.

    Raises :class:`RankError` for a zero matrix; see the module documentation for the rest.
    """
    return _value(
        "condition_number",
        S,
        rtol=rtol,
        tie_rtol=None,
        gram=gram,
        check_finite=check_finite,
        xp=xp,
        compute_dtype=compute_dtype,
    )


def r_well(
    S: Array,
    *,
    gram: bool = False,
    check_finite: bool = True,
    xp: Any = None,
    compute_dtype: Any = None,
) -> Array:
    """R_well(S) = ½ sigma_1² − ‖S‖_F² / (2p), ``p = min(m, n)`` (Eq. 3, Nenov et al.).

    Non-negative, zero iff ``S`` has full rank and ``kappa = 1``; minimising it makes ``S``
    well-conditioned. With ``gram=True`` it is R_well of ``H = FᵀF`` with ``p = D``.
    Shape ``S.shape[:-2]``.
    """
    return _value(
        "r_well",
        S,
        rtol=None,
        tie_rtol=None,
        gram=gram,
        check_finite=check_finite,
        xp=xp,
        compute_dtype=compute_dtype,
    )


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
    """R_ill(S) = 1 / (‖S‖_F² / (2k) − ½ sigma_k²), ``k`` the numerical rank (Eq. 12).

    Non-negative; at fixed ``sigma_k`` it tends to 0 iff ``kappa -> inf`` (Theorem 4.1; with
    ``sigma_1`` fixed and ``sigma_k -> 0`` it tends to ``2k / Σ_{i<k} sigma_i²`` instead).
    Minimising it makes ``S`` ill-conditioned. At its pole — all nonzero singular values equal
    (``kappa = 1``, including any rank-1 matrix) — the value is ``+inf``: values tied within
    ``tie_rtol`` count as equal, so an exactly-constructed pole gives ``+inf`` rather than a huge
    rounding artefact. The denominator is evaluated as ``Σ_{i≤k} (sigma_i² − sigma_k²) / (2k)``,
    exact and never negative.
    Shape ``S.shape[:-2]``.
    """
    return _value(
        "r_ill",
        S,
        rtol=rtol,
        tie_rtol=tie_rtol,
        gram=gram,
        check_finite=check_finite,
        xp=xp,
        compute_dtype=compute_dtype,
    )


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
    """Closed-form gradient of ``kappa``: ``u_1v_1ᵀ / sigma_k − (sigma_1 / sigma_k²) u_kv_kᵀ``.

    At tied extremes each rank-one term is replaced according to ``subgradient``. With
    ``gram=True``: the gradient of ``kappa(FᵀF)`` with respect to ``F``. Shape ``S.shape``.
    """
    return _grad(
        "condition_number",
        S,
        rtol=rtol,
        tie_rtol=tie_rtol,
        gram=gram,
        subgradient=subgradient,
        check_finite=check_finite,
        xp=xp,
        compute_dtype=compute_dtype,
    )


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
    """Closed-form (sub)gradient of R_well: ``sigma_1 u_1v_1ᵀ − S / p`` (Theorem A.1).

    At a tied sigma_1 (multiplicity r) the default uses ``(sigma_1 / r) U_J V_Jᵀ``, the
    minimum-norm subgradient. With ``gram=True``: ``2F (lambda_1 v_1v_1ᵀ − H / D)``, with respect
    to ``F``, computed from the SVD of ``F``. Shape ``S.shape``.

    Raises :class:`TiedExtremeError` for a tie under ``subgradient="raise"``.
    """
    return _grad(
        "r_well",
        S,
        rtol=None,
        tie_rtol=tie_rtol,
        gram=gram,
        subgradient=subgradient,
        check_finite=check_finite,
        xp=xp,
        compute_dtype=compute_dtype,
    )


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
    ``(sigma_k u_kv_kᵀ − S / k) / (‖S‖_F²/(2k) − ½ sigma_k²)²``.

    At a tied sigma_k the default uses the average of the tied rank-one terms (minimum norm).
    With ``gram=True``: ``2F (lambda_k v_kv_kᵀ − H/k) / den²`` with respect to ``F``.
    Shape ``S.shape``.

    Raises :class:`PoleError` at the pole (all nonzero singular values equal, including rank 1),
    where R_ill is ``+inf``; :class:`TiedExtremeError` for a tie under ``subgradient="raise"``.
    """
    return _grad(
        "r_ill",
        S,
        rtol=rtol,
        tie_rtol=tie_rtol,
        gram=gram,
        subgradient=subgradient,
        check_finite=check_finite,
        xp=xp,
        compute_dtype=compute_dtype,
    )
