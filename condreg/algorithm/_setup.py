"""What Algorithm 1 derives from the data alone, built once and held by the caller.

:func:`setup_data` decomposes the two tasks' data; :class:`DataSetup` holds the result, and
:func:`condreg.immunize` (``setup=``) reuses it instead of decomposing the data again — the
saving when several methods or runs share one pair of tasks. Nothing is kept between calls
anywhere else: reuse is this object, in the caller's hands.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from array_api_compat import device as _device

from condreg.algorithm import _validate as v
from condreg.algorithm._factored import initial_features
from condreg.algorithm._problem import TaskData, build_task
from condreg.algorithm._step import gram_was_used, is_linalg_error, spectrum
from condreg.metrics import rir_spectra, run_rtol

Array = Any


@dataclass(frozen=True, eq=False)
class DataSetup:
    """Everything :func:`condreg.immunize` derives from the data alone (:func:`setup_data`).

    A run's data are decomposed here once: one thin SVD per task, ``X = U diag(s) Vᵀ``, gives
    its factor ``A = diag(c·s_r) V_rᵀ`` of ``K̃ = c²XᵀX`` (:class:`TaskData`); the spectral
    engine's spectrum of ``F = A`` (``θ = I``) serves the default weights and the first epoch of
    every method that starts at ``θ_0 = I``. Pass it as ``immunize(..., setup=setup)`` with the
    very arrays it was built from.

    Attributes
    ----------
    X_p, X_h : array
        The arrays the setup was built from (the objects themselves: a run checks that it is
        given these objects, see :meth:`check`).
    xp : namespace
        Their Array API namespace.
    rtol : float
        The run's rank tolerance on singular values (given, or ``max(N_P, N_H, D)·eps``).
    ridge : float or None
        The preconditioner's ridge (None: pseudo-inverse).
    tasks : condreg.metrics.RIRSpectra
        The singular values of ``X_p`` and ``X_h`` at ``rtol`` (``θ = I``), exactly as
        :func:`condreg.metrics.rir` computes them: κ(K_P), κ(K_H).
    P, H : TaskData
        The pre-training and the harmful task; ``P.at_identity`` and ``H.at_identity`` hold
        the engine's spectra of their factors at ``θ = I`` (eager NumPy; empty otherwise).
    paths : tuple of str
        The engine's decomposition path per task at ``θ_0 = I``: ``"auto"`` where the Gram
        eigendecomposition resolves the spectrum, else ``"exact"``.
    built : tuple
        ``(shape, dtype)`` of ``X_p`` and of ``X_h`` when the setup was built.

    Examples
    --------
    >>> import numpy as np, condreg
    >>> from condreg.algorithm import setup_data
    >>> rng = np.random.default_rng(0)
    >>> X_p, X_h = rng.standard_normal((40, 6)), rng.standard_normal((30, 6))
    >>> y_p = rng.standard_normal(40)
    >>> setup = setup_data(X_p, X_h)
    >>> setup.paths
    ('auto', 'auto')
    >>> a = condreg.immunize(X_p, y_p, X_h, epochs=3, setup=setup, warn=False)
    >>> b = condreg.immunize(X_p, y_p, X_h, epochs=3, warn=False)
    >>> bool((a.theta == b.theta).all())
    True
    """

    X_p: Array
    X_h: Array
    xp: Any
    rtol: float
    ridge: float | None
    tasks: Any
    P: TaskData
    H: TaskData
    paths: tuple[str, str]
    #: ``(shape, dtype)`` of ``X_p`` and ``X_h`` when the setup was built
    built: tuple[tuple[tuple[int, ...], str], tuple[tuple[int, ...], str]]

    def check(self, X_p: Array, X_h: Array, *, rtol: float, ridge: float | None, xp: Any) -> None:
        """Refuse a run on other data or options than this setup's.

        "The same data" is the same array objects (``X_p is self.X_p``), with the shape and
        dtype they had when the setup was built: the data are not read again. Writing into the
        arrays between :func:`setup_data` and the run is not detected.

        Parameters
        ----------
        X_p, X_h : array
            The run's data.
        rtol : float
            The run's rank tolerance.
        ridge : float or None
            The run's preconditioner ridge.
        xp : namespace
            The run's Array API namespace.

        Raises
        ------
        ValueError
            Other arrays, a changed shape or dtype, another namespace, ``rtol`` or ``ridge``.
        """
        where = "immunize: setup was built from"
        if X_p is not self.X_p or X_h is not self.X_h:
            raise ValueError(
                f"{where} other arrays than the X_p, X_h given (pass the very arrays given to "
                "setup_data, or no setup)"
            )
        for X, name, (shape, dtype) in zip((X_p, X_h), ("X_p", "X_h"), self.built, strict=True):
            if tuple(X.shape) != shape or str(X.dtype) != dtype:
                raise ValueError(
                    f"{where} {name} of shape {shape} and dtype {dtype}; it now has shape "
                    f"{tuple(X.shape)} and dtype {X.dtype}"
                )
        if xp is not self.xp:
            raise ValueError(f"{where} arrays of namespace {self.xp.__name__}, not {xp.__name__}")
        if float(rtol) != self.rtol:
            raise ValueError(f"{where} rtol={self.rtol!r}; the run asks for rtol={rtol!r}")
        if ridge != self.ridge:
            raise ValueError(f"{where} ridge={self.ridge!r}; the run asks for ridge={ridge!r}")

    def __repr__(self) -> str:
        return (
            f"DataSetup(X_p={self.built[0][0]}, X_h={self.built[1][0]}, rtol={self.rtol:.3g}, "
            f"ridge={self.ridge!r}, paths={self.paths!r}, ranks=({self.P.rank}, {self.H.rank}))"
        )


def setup_data(
    X_p: Array,
    X_h: Array,
    *,
    rtol: float | None = None,
    ridge: float | None = None,
    xp: Any = None,
) -> DataSetup:
    """Decompose the two tasks' data once, for every :func:`condreg.immunize` run on them.

    Each task's data ``X`` (``N×D``) gets one thin SVD ``X = U diag(s) Vᵀ``; the factor
    ``A = diag(c·s_r) V_rᵀ`` of ``K̃ = c²XᵀX`` on the numerical rank ``r = #{s_i > rtol·s₁}``
    (``c`` a power of two), the left preconditioner ``K⁻¹`` and the rescaled data of the
    supervised loss follow from it; κ(K_P) and κ(K_H) are computed exactly as
    :func:`condreg.metrics.rir` does; and the spectral engine decomposes ``F = A`` (``θ = I``),
    which decides each task's decomposition path and serves the default weights and the first
    epoch of every run that starts at ``θ_0 = I``.

    Parameters
    ----------
    X_p, X_h : array, shape (N_p, D) and (N_h, D)
        The pre-training and the harmful task's inputs (one Array API library).
    rtol : float in (0, 1), optional
        The runs' rank tolerance; default ``max(N_P, N_H, D)·eps`` (as :func:`condreg.immunize`).
    ridge : float > 0, optional
        The preconditioner's ridge, as in :func:`condreg.immunize` (default: pseudo-inverse).
    xp : namespace, optional
        Array API namespace to use instead of the arrays'.

    Returns
    -------
    DataSetup
        To pass as ``setup=`` to :func:`condreg.immunize` or :func:`condreg.algorithm.prepare`
        together with these very arrays ``X_p``, ``X_h`` and the same ``rtol`` and ``ridge``;
        the runs then equal runs without it bit for bit.

    Raises
    ------
    TypeError
        Non-array data, arrays of different libraries, non-real dtypes, non-numeric options.
    ValueError
        Non-2-D or empty arrays, different numbers of features, NaN/Inf, a zero data matrix,
        ``rtol`` outside (0, 1), ``ridge <= 0``.

    Examples
    --------
    >>> import numpy as np, condreg
    >>> rng = np.random.default_rng(0)
    >>> X_p, X_h = rng.standard_normal((40, 6)), rng.standard_normal((30, 6))
    >>> y_p = rng.standard_normal(40)
    >>> setup = condreg.algorithm.setup_data(X_p, X_h)
    >>> runs = {m: condreg.immunize(X_p, y_p, X_h, method=m, epochs=3, setup=setup, warn=False)
    ...         for m in condreg.algorithm.METHODS}
    >>> sorted(runs) == sorted(condreg.algorithm.METHODS)
    True
    """
    opts = v.setup_options(rtol=rtol, ridge=ridge)
    xp = v.namespace({"X_p": X_p, "X_h": X_h}, xp)
    Xp, Xh = v.data_matrices(X_p, X_h, xp)
    return build_setup(X_p, X_h, Xp, Xh, xp, opts["rtol"], opts["ridge"])


def build_setup(
    X_p: Array, X_h: Array, Xp: Array, Xh: Array, xp: Any, rtol: float | None, ridge: float | None
) -> DataSetup:
    """:func:`setup_data` of validated data: ``X_p``, ``X_h`` the arrays as given (recorded),
    ``Xp``, ``Xh`` in the compute dtype (decomposed)."""
    rtol = float(rtol or run_rtol(Xp, Xh))  # max(N_P, N_H, D)·eps, as metrics.rir
    tasks = rir_spectra(None, Xp, Xh, rtol=rtol)  # κ(K_P), κ(K_H) as metrics.rir
    kappas = tasks.rir()
    P, path_p = _at_identity(build_task(Xp, xp, rtol, ridge, kappas.kappa_kp), rtol, xp)
    H, path_h = _at_identity(build_task(Xh, xp, rtol, ridge, kappas.kappa_kh), rtol, xp)
    built = ((tuple(X_p.shape), str(X_p.dtype)), (tuple(X_h.shape), str(X_h.dtype)))
    return DataSetup(X_p, X_h, xp, rtol, ridge, tasks, P, H, (path_p, path_h), built)


def _at_identity(task: TaskData, rtol: float, xp: Any) -> tuple[TaskData, str]:
    """The task with its spectrum at ``θ = I`` (where ``F = Aθ`` is the factor itself: eager
    NumPy, :func:`condreg.algorithm._step.initial_features`), and its path there: ``"auto"``
    where the Gram eigh resolves the spectrum, else ``"exact"`` (the eigh would be wasted every
    epoch). The spectrum is kept under ``"exact"`` too when ``"auto"`` fell back to it (the
    same computation)."""
    D = task.A.shape[1]
    F = initial_features(task, xp.eye(D, dtype=task.A.dtype, device=_device(task.A)))
    keep = F is task.A
    try:
        with np.errstate(all="ignore"):
            hs = spectrum(task, None, rtol, xp, F=F, vectors=keep, path="auto")
    except Exception as exc:  # the data overflow in the features: the loop reports it
        if not is_linalg_error(exc):
            raise
        return task, "exact"
    path = "auto" if gram_was_used(hs, xp) else "exact"
    if not keep:
        return task, path
    paths = ("auto",) if path == "auto" else ("auto", "exact")
    return replace(task, at_identity=tuple((p, hs) for p in paths)), path
