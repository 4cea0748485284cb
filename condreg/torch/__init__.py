"""PyTorch adapter: condreg's closed-form rules as the derivative of a ``torch.autograd.Function``.

``condreg.condition_number``, ``condreg.r_well`` and ``condreg.r_ill`` dispatch here for
``torch.Tensor`` input, so they differentiate natively — ``.backward()``,
``torch.autograd.grad``, ``torch.func.grad``/``vjp``/``jacrev``/``vmap``, forward mode
(``torch.func.jvp``/``jacfwd``/``hessian``, ``torch.autograd.forward_ad``; not inside
``torch.compile``, whose tracer does not support a custom ``jvp``) and ``torch.compile``
(``fullgraph=True`` included) — on CPU and CUDA, for a single matrix or a batch ``(..., m, n)``.
The derivative is the verified closed form of :mod:`condreg._core`, ``G = U diag(d) Vᵀ`` with
the minimum-norm subgradient at tied extremes (the ``subgradient="min_norm"`` policy of the
``*_grad`` functions); it never differentiates through singular vectors. The backward returns
``grad_value[..., None, None] * G``; the forward-mode rule (``jvp``) returns ``Σ G * Ṡ`` over the
last two axes — the same linear map, so forward and reverse mode agree, also at ties.

One decomposition per step
--------------------------
The forward decomposes ``S`` once with the engine's cheapest exact path (:mod:`condreg._spectrum`:
with ``gram=True`` the eigh of the smaller Gram matrix where it resolves the spectrum, a QR/SVD of
``F`` otherwise) and, when a gradient may be asked for (grad mode on and ``S.requires_grad``),
computes ``d value / d mu`` and keeps what the closed form needs (with ``gram=True`` the small
side's matrix ``P = 2 Q diag(g) Qᵀ``); the backward is then one GEMM with ``F`` (``P F`` or
``F P``) and the scaling, without decomposing again. Without a gradient the forward computes
values only. For a single CPU matrix with readable values two shortcuts apply
(:mod:`condreg._spectrum`): from ``min(N, D) = 128`` on the forward runs ``eigvalsh`` plus the
eigenvectors of the extreme tie sets only (``extreme_gram_product``: every quantity's
derivative is ``a·mu + h`` with ``h`` on those sets), with the full ``eigh`` of the same Gram
matrix as the fallback where a tie set is not well separated (the one case with a second
decomposition); below 128 the spectrum's small per-value arithmetic runs in NumPy on zero-copy
arrays (``decompose_host``).

The most common call — one plain CPU feature batch, ``gram=True``, checks on, a gradient asked
for, eagerly — goes through a leaner Function of the same rule (``_EagerHostGram``: classic
``forward(ctx, ...)`` style, one output, its own input checks, finiteness read off the Gram
matrix it forms), whose spectrum's values live in NumPy at every size (``decompose_host``,
``decompose_host_extreme``); under ``torch.func`` transforms and ``torch.compile``, for
batches, on a GPU and with ``check_finite=False`` the general one runs.

Second order
------------
When the backward itself is differentiated (``create_graph=True``: double backward,
Hessian-vector products, ``torch.func.hessian``, ``torch.func.grad`` of a ``torch.func.grad``,
``gradgradcheck``; also every ``torch.func`` transform, which runs the backward with grad mode
on) and in forward mode (``jvp``), the closed form ``G(S)`` is recomputed with differentiable
torch operations from ``S`` (thin SVD), so PyTorch's own SVD derivative differentiates it. That
is exact wherever the quantity is twice differentiable: at generic points (distinct nonzero
singular values, fixed rank).

At ties the second derivative does not exist, and condreg does not detect this or substitute
anything: where singular values coincide — a tied extreme, but also any repeated value inside the
spectrum and repeated zeros of a rank-deficient matrix — the derivative of the singular vectors
has ``1 / (sigma_i² − sigma_j²)`` factors, so what double backward returns there is meaningless:
huge, basis-dependent, ``inf`` or ``NaN``. (The first derivative stays the basis-independent
minimum-norm subgradient.) Second-order methods should not rely on curvature at ties; near a tie
the curvature is correct but large, like ``1 / gap``.

Checks and host synchronisation
-------------------------------
Forward and backward run no ``.item()`` or other host synchronisation except the documented
value checks (the input is finite and not the zero matrix; in the backward of ``r_ill``, that it
is not at its pole). ``check_finite=False`` turns all of them off: the adapter then never reads a
tensor value (never calls :func:`concrete`), and invalid input gives ``NaN``/``inf``. Under
``torch.compile`` and inside ``torch.func.vmap`` (also ``vmap(grad(...))``) values cannot be read
and the checks are skipped automatically, without a graph break: there, as with
``check_finite=False``, a zero matrix or ``r_ill`` at its pole gives ``NaN``/``inf`` gradients
instead of an error. Eagerly (including ``torch.func.grad``), errors are raised: ``ValueError``
for NaN/Inf input, :class:`condreg.RankError` for a zero matrix, and, from the backward of
``r_ill`` at its pole (where the value is ``+inf``), :class:`condreg.PoleError` — never a NaN
gradient. ``torch.func.vmap`` of the value functions uses a custom rule that calls the batched
core directly, so the forward checks do run there on the whole batch.

Training adapters (a regularizer loss module, the preconditioning "dummy layer") live in
:mod:`condreg.torch.nn`.
"""

from __future__ import annotations

import math

try:
    import torch
except ImportError as exc:  # pragma: no cover - exercised only without torch
    raise ImportError(
        "condreg.torch needs PyTorch: pip install 'condreg[torch]' (or your own torch build)"
    ) from exc

from array_api_compat import array_namespace

from condreg import _core, _spectrum, _validation

__all__ = ["concrete", "value"]


def _untraceable(x: torch.Tensor) -> bool:
    if torch.compiler.is_compiling():
        return True
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(x, FakeTensor) or x.device.type == "meta"


def concrete(x: torch.Tensor) -> bool | None:
    """Read a 0-d boolean tensor (one host synchronisation on a GPU), or return ``None`` when its
    value cannot be read: under ``torch.compile`` (dynamo, fake or meta tensors) and inside
    ``torch.func.vmap`` (batched tensors)."""
    if _untraceable(x):
        return None
    try:
        return bool(x)
    except RuntimeError:  # functorch vmap: data-dependent control flow is not allowed
        return None


def _concrete_or_skip(check: bool) -> _core.Concrete:
    # Look ``concrete`` up at call time (not bound at import), so tests can watch it.
    return concrete if check else _core.never


def _closed_form(S: torch.Tensor, config: tuple) -> torch.Tensor:
    """The closed-form (sub)gradient ``G(S)`` recomputed with differentiable torch operations on
    ``S`` (thin SVD): used for higher order (``create_graph``) and forward mode."""
    quantity, rtol, tie_rtol, gram, check = config
    return _core.gradient(
        quantity,
        S,
        array_namespace(S),
        rtol=rtol,
        tie_rtol=tie_rtol,
        gram=gram,
        subgradient="min_norm",
        concrete=_concrete_or_skip(check),
        method="svd",
    )


def _numpy():
    import numpy

    return numpy


def _extreme_eligible(S: torch.Tensor, gram: bool, check: bool) -> bool:
    """Whether the forward may take the extreme-cluster assembly: ``gram``, a single CPU matrix
    of small side at least :data:`condreg._spectrum.EXTREME_MIN`, values readable (``check``,
    not traced). (On a GPU its reads of the eigenvalues and checks would be host
    synchronisations: there the all-vectors path is kept.)"""
    return (
        gram
        and check
        and S.ndim == 2
        and S.device.type == "cpu"
        and min(S.shape) >= _spectrum.EXTREME_MIN
        and not _untraceable(S)
    )


def _forward(S, quantity, rtol, tie_rtol, gram, check, vectors):
    """``(value, A, B, g, first, second, pole)``: the value and, with ``vectors``, what the
    backward needs: with ``gram`` the small side's matrix ``P = 2 Q diag(g) Qᵀ`` (the gradient
    is ``P F`` or ``F P``) and empty ``B``, ``g``; otherwise ``U``, ``Vh`` and
    ``g = d value / d mu`` on the spectrum divided by ``s_1``; the two factors of the power of
    ``s_1`` the gradient is scaled by (:func:`condreg._spectrum.power_factors`) and, for
    ``r_ill``, which matrices are at the pole. Empty tensors without ``vectors``.

    With ``gram``, a single large enough matrix and readable values, the Gram path runs
    ``eigvalsh`` and forms ``P`` from the Gram matrix and the eigenvectors of the extreme tie
    sets only (:func:`condreg._spectrum.extreme_gram_product`), falling back to the full eigh
    of the same Gram matrix where a tie set is not well separated."""
    xp = array_namespace(S)
    tie = _core.check_tie_rtol(tie_rtol)
    concrete = _concrete_or_skip(check)
    empty = S.new_empty(0)
    unit = None
    hp = xp  # the namespace of the spectrum's values
    if vectors and gram and _spectrum.host_eligible(S, concrete):
        sp = _spectrum.decompose_host(S, xp, rtol=rtol)
        hp = _numpy()
    elif vectors and _extreme_eligible(S, gram, check):
        sp, unit = _spectrum.decompose_extreme(S, xp, rtol=rtol, concrete=concrete)
    else:
        sp = _spectrum.decompose(
            S, xp, gram=gram, vectors=vectors, rtol=rtol, concrete=concrete, method="auto"
        )
    if not vectors:
        out = _core.value_from_spectrum(quantity, sp, xp, tie_rtol=tie)
        return out, empty, empty, empty, empty, empty, empty
    r = _core.value_and_dmu(quantity, sp, hp, tie_rtol=tie, subgradient="min_norm")
    degree = _core._DEGREE[quantity]
    # With gram the gradient is assembled on F itself, which carries one power of s_1.
    first, second = _spectrum.power_factors(r.s1[..., None], 2 * degree if gram else degree, hp)
    pole = empty if r.pole is None else r.pole
    if hp is not xp:  # NumPy values of a CPU spectrum: zero-copy tensors
        value, g, first, second, pole = (
            a if isinstance(a, torch.Tensor) else torch.from_numpy(hp.asarray(a))
            for a in (r.value, r.g, first, second, pole)
        )
        r = r._replace(value=value, g=g)
    if not gram:
        return r.value, sp.U, sp.Vh, r.g, first, second, pole
    P = _small_side_matrix(sp, unit, r, r.g, S.dtype, xp)
    return r.value, P, empty, S.new_empty(0), first, second, pole


def _small_side_matrix(sp, unit, r, g: torch.Tensor, dtype, xp) -> torch.Tensor:
    """``P = 2 Q diag(g) Qᵀ`` on the small side (the gradient is ``P F`` or ``F P``): from the
    extreme clusters' vectors where the forward kept the :class:`condreg._spectrum.UnitGram`
    (``unit``), with all the vectors of the same Gram matrix where a tie set is not well
    separated; else from the spectrum's vectors. In ``dtype``."""
    if unit is not None:
        P = _spectrum.extreme_gram_product(unit, r.a, r.h, xp)
        if P is not None:
            return P.to(dtype)
        Q = torch.linalg.eigh(unit.M)[1].flip(-1).to(dtype)
    else:
        Q = sp.U if sp.U is not None else sp.Vh.mT
    return (Q * (2.0 * g)[..., None, :]) @ Q.mT


def _backward(ctx, grad_value: torch.Tensor, vectors: bool) -> torch.Tensor:
    """The gradient with respect to ``S`` from what the forward saved (``S`` and the parts of
    :func:`_forward`): one GEMM and the scaling, or, for higher order (grad mode on in the
    backward) and without saved vectors, the differentiable recomputation."""
    S, A, B, g, first, second, pole = ctx.saved_tensors
    quantity, rtol, tie_rtol, gram, check = ctx.config
    if torch.is_grad_enabled() or not vectors:
        return grad_value[..., None, None] * _closed_form(S, ctx.config)
    if pole.numel():
        _core.check_pole(torch.any(pole), _concrete_or_skip(check))
    if gram:  # A = P = 2 Q diag(g) Qᵀ
        G = A @ S if S.shape[-2] < S.shape[-1] else S @ A
    else:
        G = (A * g[..., None, :]) @ B
    return _scaled(G, first * grad_value[..., None, None], second, grad_value)


def _scaled(G: torch.Tensor, factor, second, grad_value: torch.Tensor) -> torch.Tensor:
    """``G · factor · second`` (``second`` None: 1): in place — ``G`` is a fresh tensor and
    nothing differentiates the first-order backward — unless the incoming gradient is batched
    (:func:`_batched`), where an in-place update by it is refused."""
    if _batched(grad_value):
        G = G * factor
        return G if second is None else G * second
    G.mul_(factor)
    return G if second is None else G.mul_(second)


def _batched(x: torch.Tensor) -> bool:
    """Whether the incoming gradient ``x`` is batched (``autograd.grad(...,
    is_grads_batched=True)`` and ``gradcheck(check_batched_grad=True)`` vmap over it, with
    PyTorch's legacy vmap or functorch's), where an in-place update of an unbatched tensor by
    it is refused. False while compiling (dynamo cannot trace the test; its graph is not
    batched this way)."""
    if torch.compiler.is_compiling():
        return False
    functorch = torch._C._functorch
    return functorch.is_legacy_batchedtensor(x) or functorch.is_batchedtensor(x)


class _SpectralValue(torch.autograd.Function):
    """value = quantity(S); backward: ``grad_value * G(S)``.

    The forward decomposes ``S`` once (the engine's cheapest exact path) and, when a gradient
    is required, keeps the spectrum for the backward; the backward redoes the decomposition only
    for higher order (``create_graph``), with differentiable operations.
    """

    @staticmethod
    def forward(S, quantity, rtol, tie_rtol, gram, check, vectors):  # type: ignore[override]
        return _forward(S, quantity, rtol, tie_rtol, gram, check, vectors)

    @staticmethod
    def setup_context(ctx, inputs, output):  # type: ignore[override]
        S, quantity, rtol, tie_rtol, gram, check, vectors = inputs
        ctx.mark_non_differentiable(*output[1:])
        ctx.save_for_backward(S, *output[1:])
        ctx.config = (quantity, rtol, tie_rtol, gram, check)
        ctx.vectors = vectors

    @staticmethod
    def backward(ctx, grad_value, *_):  # type: ignore[override]
        G = _backward(ctx, grad_value, ctx.vectors)
        return G, None, None, None, None, None, None

    @staticmethod
    def vmap(info, in_dims, S, quantity, rtol, tie_rtol, gram, check, vectors):  # type: ignore[override]
        # The core is batched over leading axes: move the vmapped axis to the front.
        bdim = in_dims[0]
        if bdim is not None:
            S = S.movedim(bdim, 0)
        # The top-level finite check saw a batched tensor and could not read it; the batch is
        # concrete here, so the documented ValueError comes before any decomposition.
        if check and _concrete_or_skip(check)(torch.all(torch.isfinite(S))) is False:
            raise _validation.nonfinite_error(quantity)
        outs = _function().apply(S, quantity, rtol, tie_rtol, gram, check, vectors)
        dims = tuple(None if (bdim is None or o.numel() == 0) else 0 for o in outs)
        return outs, dims


class _SpectralValueWithJvp(_SpectralValue):
    """:class:`_SpectralValue` plus forward mode: jvp ``Σ G(S) * Ṡ``.

    Separate because dynamo cannot trace a Function that defines ``jvp``: under
    ``torch.compile`` the class without it is used, so the compiled graph has no break.
    """

    @staticmethod
    def setup_context(ctx, inputs, output):  # type: ignore[override]
        _SpectralValue.setup_context(ctx, inputs, output)
        ctx.save_for_forward(inputs[0])

    @staticmethod
    def jvp(ctx, S_dot, *_):  # type: ignore[override]
        S = ctx.saved_tensors[0]
        G = _closed_form(S, ctx.config)
        return (G * S_dot).sum(dim=(-2, -1)), None, None, None, None, None, None


def _function() -> type[torch.autograd.Function]:
    return _SpectralValue if torch.compiler.is_compiling() else _SpectralValueWithJvp


def _needs_vectors(S: torch.Tensor) -> bool:
    """Whether a reverse-mode gradient may be asked for (then the forward keeps the spectrum)."""
    return torch.is_grad_enabled() and S.requires_grad


def _host_parts(S: torch.Tensor, quantity: str, rtol, tie_rtol) -> tuple:
    """``(value, P, first, second, pole)`` of :class:`_EagerHostGram`: the value (0-d tensor),
    the small side's ``P = 2 Q diag(g) Qᵀ`` (the gradient is ``P F`` or ``F P`` times
    ``first · second``, Python floats, ``second`` None when it is 1) and, for ``r_ill``, whether
    the value is at its pole (a Python bool). Raises ``ValueError`` for NaN/Inf input and an
    invalid ``rtol``/``tie_rtol``, :class:`RankError` for a zero matrix."""
    np = _numpy()
    F = S.detach()
    M = _spectrum.host_gram(F)
    # NaN/Inf input gives a non-finite diagonal; a finite one may still overflow (the exact path)
    if not math.isfinite(float(np.trace(M.numpy()))) and _validation.nonfinite_input(F):
        raise _validation.nonfinite_error(quantity)  # before the tolerances, as validation does
    tie = _core.check_tie_rtol(tie_rtol)
    xp = array_namespace(F)
    if min(F.shape) < _spectrum.EXTREME_MIN:
        sp, unit = _spectrum.decompose_host(F, xp, rtol=rtol, M=M), None
    else:
        sp, unit = _spectrum.decompose_host_extreme(F, xp, rtol=rtol, M=M)
    r = _core.value_and_dmu(quantity, sp, np, tie_rtol=tie, subgradient="min_norm")
    # With gram the gradient is assembled on F itself, which carries one power of s_1.
    first, second = _spectrum.power_factors(r.s1[..., None], 2 * _core._DEGREE[quantity], np)
    first, second = float(first.reshape(())), float(second.reshape(()))
    P = _small_side_matrix(sp, unit, r, torch.from_numpy(r.g), F.dtype, xp)
    pole = r.pole is not None and bool(r.pole)
    value = torch.from_numpy(np.asarray(r.value))  # on the CPU, whatever the default device
    return value, P, first, (None if second == 1.0 else second), pole


class _EagerHostGram(torch.autograd.Function):
    """:class:`_SpectralValueWithJvp` for the most common call, with less per-call machinery: a
    single plain CPU matrix with ``gram=True``, checks on, a gradient asked for, eagerly (no
    ``torch.func`` transform, not compiling; :func:`eager_host`). The same rule: the forward
    is the host path (values in NumPy: :func:`condreg._spectrum.decompose_host`, and from
    ``min(N, D) = 128`` on :func:`condreg._spectrum.decompose_host_extreme` with
    :func:`condreg._spectrum.extreme_gram_product`) and keeps ``P``; the backward is the GEMM
    with ``F`` and the scaling (and, for higher order, the same differentiable recomputation).
    Written in the classic ``forward(ctx, ...)`` style, which PyTorch applies without binding
    the arguments to the signature on every call (as it does for a ``setup_context``
    Function), with one output instead of seven; such a Function cannot run under
    ``torch.func`` transforms, hence the eligibility test.

    The input is validated here (:func:`eager_host` implies every check of
    :func:`condreg._validation.matrix` except finiteness): a non-finite Gram matrix means
    non-finite input (``ValueError``) or a Gram that overflows float64 (then the exact path of
    :func:`condreg._spectrum.decompose_host`)."""

    @staticmethod
    def forward(ctx, S, quantity, rtol, tie_rtol):  # type: ignore[override]
        value, P, first, second, pole = _host_parts(S, quantity, rtol, tie_rtol)
        ctx.save_for_backward(S, P)
        ctx.save_for_forward(S)
        ctx.config = (quantity, rtol, tie_rtol, True, True)
        ctx.host = (first, second, pole)
        return value

    @staticmethod
    def backward(ctx, grad_value):  # type: ignore[override]
        if torch.is_grad_enabled():  # higher order: the differentiable recomputation
            G = grad_value[..., None, None] * _closed_form(ctx.saved_tensors[0], ctx.config)
            return G, None, None, None
        S, P = ctx.saved_tensors
        first, second, pole = ctx.host
        if pole:
            _core.check_pole(True, _core.eager)
        G = P @ S if S.shape[-2] < S.shape[-1] else S @ P
        return _scaled(G, grad_value * first, second, grad_value), None, None, None

    @staticmethod
    def jvp(ctx, S_dot, *_):  # type: ignore[override]
        return _SpectralValueWithJvp.jvp(ctx, S_dot)[0]


#: Tensor types :class:`_EagerHostGram` takes (subclasses such as DTensor or fake tensors go
#: the general way).
_PLAIN = (torch.Tensor, torch.nn.Parameter)


def eager_host(S: torch.Tensor) -> bool:
    """Whether ``condreg``'s values with ``gram=True`` and checks on take
    :class:`_EagerHostGram` for ``S``: a gradient is asked for (grad mode on,
    ``S.requires_grad``) of a plain non-empty 2-D float32/float64 CPU tensor, eagerly (no
    ``torch.func`` transform active, not compiling)."""
    return (
        type(S) in _PLAIN
        and S.requires_grad
        and S.ndim == 2
        and min(S.shape) > 0
        and (S.dtype == torch.float64 or S.dtype == torch.float32)
        and S.device.type == "cpu"
        and torch.is_grad_enabled()
        and not torch.compiler.is_compiling()
        and not torch._C._are_functorch_transforms_active()
    )


def eager_host_value(quantity: str, S: torch.Tensor, *, rtol, tie_rtol) -> torch.Tensor:
    """``quantity(S, gram=True)`` through :class:`_EagerHostGram` (``S``: :func:`eager_host`;
    not validated before: the Function does it)."""
    return _EagerHostGram.apply(S, quantity, rtol, tie_rtol)


def _apply(S, quantity, rtol, tie_rtol, gram, check):
    if gram and check and eager_host(S):
        return _EagerHostGram.apply(S, quantity, rtol, tie_rtol)
    vectors = _needs_vectors(S)
    return _function().apply(S, quantity, rtol, tie_rtol, gram, check, vectors)[0]


def value(
    quantity: str,
    S: torch.Tensor,
    *,
    rtol: float | None,
    tie_rtol: float | None,
    gram: bool,
    check: bool,
) -> torch.Tensor:
    """Differentiable value of ``quantity`` (validated ``S``; used by the top-level functions)."""
    return _apply(S, quantity, rtol, tie_rtol, gram, check)
