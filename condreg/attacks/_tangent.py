"""``tangent_condition``: the condition number of the problem an attacker who trains weights
solves — the empirical tangent kernel of the trained parameters on a batch (PyTorch)."""

from __future__ import annotations

import numbers
from typing import Any

__all__ = ["tangent_condition"]


def tangent_condition(
    extractor: Any,
    X: Any,
    *,
    block: str | None = None,
    head: Any = None,
    rtol: float | None = None,
) -> float:
    """κ of the empirical tangent kernel ``J Jᵀ`` of the trained parameters on a batch.

    The network is ``f(x) = head(extractor(x))`` (``extractor(x)`` without ``head``), with
    ``K`` outputs per example. ``J`` is the Jacobian of the ``n·K`` outputs on the batch ``X``
    with respect to the trained parameters ``p`` at their current values — the parameters of
    the submodule ``block`` of ``extractor`` (or every parameter of ``extractor`` when
    ``block`` is ``None``), plus every parameter of ``head`` when it is given: rows
    ``(example, output)``, columns the ``P`` flattened parameters. The result is

        κ(J Jᵀ) = σ₁(J)² / σ_k(J)²,  k the numerical rank of J,

    the ratio of the largest to the smallest nonzero eigenvalue of the empirical tangent kernel
    (the neural tangent kernel of the batch). For the squared loss of the linearized network
    ``f(p₀) + J(p − p₀)`` the Hessian with respect to ``p`` is ``2JᵀJ``, whose nonzero
    eigenvalues are those of ``2JJᵀ``: this κ is the condition number gradient descent on the
    attacker's own problem sees, as κ(FᵀF) is the linear probe's. Special cases: a linear head
    ``K×D`` without bias trained on features ``F`` gives ``J = F ⊗ I_K``, ``JJᵀ = FFᵀ ⊗ I_K``
    and κ = κ(FᵀF) (the probing Hessian's; the Kronecker factor repeats each eigenvalue ``K``
    times); with a bias, κ of ``[F 1]ᵀ[F 1]``. A linear block ``W`` without bias on inputs
    ``X`` followed by a fixed linear map ``A`` gives ``JJᵀ = XXᵀ ⊗ AAᵀ``, κ = κ(XXᵀ)·κ(AAᵀ)
    over the nonzero singular values.

    ``J`` is computed with ``torch.func`` — ``vmap`` over the examples of ``jacrev`` of
    ``functional_call`` — with the network in eval mode (batch normalization uses its running
    statistics, dropout is off; the caller's modules and their train/eval flags are left as
    they were). κ is :func:`condreg.condition_number` ``(J, gram=True)``, which is κ(JᵀJ): its
    nonzero eigenvalues are those of ``JJᵀ``, so it equals κ(JJᵀ) over the nonzero spectrum.
    condreg's spectral engine takes the eigenvalues of the smaller Gram (``n·K × n·K`` when
    ``n·K ≤ P``) where that Gram resolves the spectrum, else a QR + SVD of ``J`` — the one
    route every κ in condreg takes; no kernel is formed here.

    **Limits of the linearization.** The kernel is that of the network at its current weights;
    training moves it (the lazy / NTK regime, where it barely moves, needs wide networks and
    small rates). It describes gradient descent on a squared loss; cross-entropy's Hessian
    weights ``J`` by the softmax's curvature, which this κ leaves out. It is measured on one
    batch: with ``n·K < P`` the kernel has rank at most ``n·K`` and κ is over its nonzero
    eigenvalues, a lower bound on the full problem's directions. Adaptive optimizers (Adam,
    AdamW) precondition ``J`` diagonally and see a different κ. ``J`` is held in memory:
    ``n·K·P`` numbers.

    Parameters
    ----------
    extractor : torch.nn.Module
        Maps a batch of inputs to outputs ``(n, K)`` (features).
    X : torch.Tensor or numpy.ndarray
        A batch of inputs ``(n, …)``, ``n ≥ 1``; real floating values are cast to the
        parameters' dtype, integer inputs (token ids) are passed as they are.
    block : str, optional
        The trained submodule, a name in ``extractor.named_modules()``; ``None``: every
        parameter of ``extractor``.
    head : torch.nn.Module, optional
        A module applied to the extractor's outputs whose parameters are trained too (the
        attacker's head); ``f(x) = head(extractor(x))``.
    rtol : float, optional
        The rank tolerance of :func:`condreg.condition_number` on the singular values of ``J``
        (default ``max(n·K, P)·eps``).

    Returns
    -------
    float
        κ of the empirical tangent kernel over its nonzero eigenvalues.

    Raises
    ------
    TypeError
        ``extractor`` or ``head`` is not a ``torch.nn.Module``; ``X`` is not a tensor or array.
    ValueError
        An unknown ``block``; no parameter to train; an empty, complex or non-finite batch;
        outputs that are not ``(n, K)``; a zero Jacobian (:class:`condreg.RankError`, a
        ``ValueError``).
    ImportError
        PyTorch is not installed.

    Examples
    --------
    >>> import torch
    >>> from condreg.attacks import tangent_condition
    >>> F = torch.tensor([[1.0, 0.0], [0.0, 0.1], [0.0, 0.0]], dtype=torch.float64)
    >>> head = torch.nn.Linear(2, 3, bias=False).double()
    >>> round(tangent_condition(torch.nn.Identity(), F, head=head), 6)  # κ(FᵀF) = 1 / 0.01
    100.0
    """
    if rtol is not None and not (isinstance(rtol, numbers.Real) and not isinstance(rtol, bool)):
        raise TypeError(f"tangent_condition: rtol must be a real number, got {type(rtol)}")
    from condreg.torch import _tangent

    return _tangent.tangent_condition(extractor, X, block=block, head=head, rtol=rtol)
