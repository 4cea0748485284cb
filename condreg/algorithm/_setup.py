"""What Algorithm 1 derives from the data alone (:func:`setup_data`), held by the caller."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from array_api_compat import device as _device

from condreg.algorithm import _validate as v
from condreg.algorithm._factored import initial_features
from condreg.algorithm._problem import TaskData, build_task
from condreg.algorithm._step import probe_path
from condreg.metrics import rir_spectra, run_rtol

Array = Any


@dataclass(frozen=True, eq=False)
class DataSetup:
    """Everything :func:`condreg.immunize` derives from the data alone (:func:`setup_data`):
    the singular values of ``X_p``, ``X_h`` (``tasks``, as :func:`condreg.metrics.rir`), the two
    tasks with their spectra at ``θ = I`` (``P``, ``H``) and paths. Pass it as
    ``immunize(..., setup=setup)`` with the very arrays it was built from (``built``)."""

    X_p: Array
    X_h: Array
    xp: Any
    rtol: float
    ridge: float | None
    tasks: Any
    P: TaskData
    H: TaskData
    paths: tuple[str, str]
    built: tuple[tuple[tuple[int, ...], str], tuple[tuple[int, ...], str]]

    def check(self, X_p: Array, X_h: Array, *, rtol: float, ridge: float | None, xp: Any) -> None:
        """Refuse a run on other data (other objects, shapes or dtypes) or options.

        Parameters
        ----------
        X_p, X_h, rtol, ridge, xp
            The run's data, rank tolerance, preconditioner ridge and Array API namespace.

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
    X_p: Array, X_h: Array, *, rtol: float | None = None, ridge: float | None = None, xp: Any = None
) -> DataSetup:
    """Decompose the two tasks' data once, for every :func:`condreg.immunize` run on them.

    One thin SVD per task gives the factor ``A = diag(c·s_r) V_rᵀ`` of ``K̃ = c²XᵀX``, the
    preconditioner and κ(K), and the engine's spectrum at ``θ = I`` picks each task's path.

    Parameters
    ----------
    X_p, X_h : array, shape (N_p, D) and (N_h, D)
        The pre-training and the harmful task's inputs (one Array API library).
    rtol, ridge, xp
        As in :func:`condreg.immunize` (``rtol`` default ``max(N_P, N_H, D)·eps``).

    Returns
    -------
    DataSetup
        For ``setup=`` with these arrays, ``rtol`` and ``ridge``: the runs are the same bit for bit.

    Raises
    ------
    TypeError, ValueError
        As :func:`condreg.immunize` for the data, ``rtol`` and ``ridge``.

    Examples
    --------
    >>> import numpy as np, condreg
    >>> X_p, X_h = np.random.default_rng(0).standard_normal((2, 40, 6))
    >>> setup = condreg.algorithm.setup_data(X_p, X_h)
    >>> res = condreg.immunize(X_p, X_p[:, 0], X_h, epochs=3, setup=setup, warn=False)
    >>> setup.paths
    ('auto', 'auto')
    """
    opts = v.setup_options(rtol=rtol, ridge=ridge)
    xp = v.namespace({"X_p": X_p, "X_h": X_h}, xp)
    Xp, Xh = v.data_matrices(X_p, X_h, xp)
    return build_setup(X_p, X_h, Xp, Xh, xp, opts["rtol"], opts["ridge"])


def build_setup(
    X_p: Array, X_h: Array, Xp: Array, Xh: Array, xp: Any, rtol: float | None, ridge: float | None
) -> DataSetup:
    """:func:`setup_data` of validated data: ``X_p``, ``X_h`` as given, ``Xp``, ``Xh`` cast."""
    rtol = float(rtol or run_rtol(Xp, Xh))  # max(N_P, N_H, D)·eps, as metrics.rir
    tasks = rir_spectra(None, Xp, Xh, rtol=rtol)  # κ(K_P), κ(K_H) as metrics.rir
    kappas = tasks.rir()
    P, path_p = _at_identity(build_task(Xp, xp, rtol, ridge, kappas.kappa_kp), rtol, xp)
    H, path_h = _at_identity(build_task(Xh, xp, rtol, ridge, kappas.kappa_kh), rtol, xp)
    built = ((tuple(X_p.shape), str(X_p.dtype)), (tuple(X_h.shape), str(X_h.dtype)))
    return DataSetup(X_p, X_h, xp, rtol, ridge, tasks, P, H, (path_p, path_h), built)


def _at_identity(task: TaskData, rtol: float, xp: Any) -> tuple[TaskData, str]:
    """The task with its spectrum at ``θ = I`` kept (eager NumPy, ``F = A``), and its path."""
    F = initial_features(task, xp.eye(task.A.shape[1], dtype=task.A.dtype, device=_device(task.A)))
    keep = F is task.A
    hs, path = probe_path(task, F, rtol, xp, vectors=keep)
    if not keep or hs is None:
        return task, path
    paths = ("auto",) if path == "auto" else ("auto", "exact")
    return replace(task, at_identity=tuple((p, hs) for p in paths)), path
