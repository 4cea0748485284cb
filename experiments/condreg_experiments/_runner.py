"""The one runner of every study's units (a seed, a (seed, pair), an (arch, domain, seed), …):
the settings check and ``--resume`` (:class:`UnitStore`), load-or-compute, the atomic save of each
unit as soon as it is done, progress, a spawn pool with one worker initializer and one ``--jobs``
default, and one timing schema (:meth:`Units.timing`, ``results.json``'s ``results.timing``).
Ctrl-C stops the pool; the units saved so far stay for ``--resume`` (condreg's CLI says so)."""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import os
import pathlib
import signal
import sys
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any

from condreg_experiments import UsageError
from condreg_experiments._report import from_jsonable, prepare_out_dir, to_jsonable

__all__ = ["UnitStore", "Units", "default_jobs", "init_worker", "run_units"]


class UnitStore:
    """Completed units of a long run, one JSON file each in ``out_dir/units/`` (with the settings
    they were computed with: ``--resume`` reuses a unit only under the same settings).

    Parameters
    ----------
    out_dir : str or pathlib.Path
        The study's output folder.
    settings : mapping
        What the units depend on (JSON-able); a saved unit with other settings is an error.
    resume : bool
        Reuse the units saved in ``out_dir/units/`` (else compute every unit again).
    """

    def __init__(
        self, out_dir: str | pathlib.Path, *, settings: Mapping[str, Any], resume: bool
    ) -> None:
        self.dir = pathlib.Path(out_dir) / "units"
        self.settings = to_jsonable(dict(settings))
        self.resume = bool(resume)
        self.loaded: list[str] = []

    def load(self, key: str) -> Any | None:
        """The saved unit ``key`` (``resume=True``, same settings), else None."""
        path = self.dir / f"{key}.json"
        if not (self.resume and path.is_file()):
            return None
        try:
            saved = json.loads(path.read_text(encoding="utf-8"))
            settings, unit = saved["settings"], saved["unit"]
        except (ValueError, KeyError, TypeError):
            return None  # a damaged file (e.g. a run killed mid-write): compute it again
        if settings != self.settings:
            keys = set(settings) | set(self.settings)
            differ = sorted(k for k in keys if settings.get(k) != self.settings.get(k))
            raise UsageError(
                f"--resume: {path} was computed with other settings ({', '.join(differ)}); "
                f"use the same options, another --out, or leave out --resume"
            )
        self.loaded.append(key)
        return from_jsonable(unit)

    def save(self, key: str, unit: Any) -> None:
        """Write unit ``key`` atomically (a temporary file, then a rename; creates ``units/``)."""
        path = prepare_out_dir(self.dir) / f"{key}.json"
        tmp = path.with_suffix(".json.tmp")
        payload = {"settings": self.settings, "unit": to_jsonable(unit)}
        tmp.write_text(json.dumps(payload, allow_nan=False, ensure_ascii=False), encoding="utf-8")
        tmp.replace(path)

    def note(self, what: str) -> list[str]:
        """The ``--resume`` note of table.md and results.json: how many ``what`` were reused
        (``[]`` when none was)."""
        if not self.loaded:
            return []
        return [f"--resume: {len(self.loaded)} {what} taken from {self.dir}"]


def default_jobs(n_units: int) -> int:
    """Every study's ``--jobs`` default: ``min(os.cpu_count(), 8, n_units // 2)``, at least 1
    (a pool pays off from two pieces of work per worker).

    Parameters
    ----------
    n_units : int
        The pieces of work to run (units, or chains of units).

    Returns
    -------
    int
        The number of worker processes.
    """
    return max(1, min(os.cpu_count() or 1, 8, n_units // 2))


def init_worker(threads: int, torch_threads: bool) -> None:
    """The initializer of every worker process: ``threads`` BLAS threads (and torch threads with
    ``torch_threads``), and Ctrl-C left to the parent, which stops the pool and reports what was
    kept (a worker that took SIGINT too would print a traceback).

    Parameters
    ----------
    threads : int
        Threads of the worker.
    torch_threads : bool
        Set torch's intra-op threads too (imports torch).
    """
    from threadpoolctl import threadpool_limits

    from condreg_experiments._report import load_blas_libraries

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    load_blas_libraries()
    threadpool_limits(limits=threads)
    if torch_threads:
        import torch

        torch.set_num_threads(threads)


@dataclasses.dataclass
class Units:
    """What :func:`run_units` returns: every unit by key (``units``), the keys computed now
    (``computed``, the others were resumed), the workers (``jobs``), the wall time of the
    computation (``wall_s``), and each computed unit's CPU and wall seconds."""

    units: dict[Hashable, Any]
    computed: list[Hashable]
    jobs: int
    wall_s: float
    cpu_s: dict[Hashable, float]
    seconds: dict[Hashable, float]

    def timing(self, *more: Units, **extra: Any) -> dict[str, Any]:
        """``results.timing`` of results.json, the same keys in every study.

        Parameters
        ----------
        *more : Units
            Later phases of the same study, counted together with this one.
        **extra : Any
            The study's own timing entries, after the common ones.

        Returns
        -------
        dict
            ``jobs``, ``units``, ``units_computed``, ``units_resumed``, ``compute_wall_s``,
            ``units_seconds``, ``units_cpu_s``, then ``extra``.
        """
        runs = (self, *more)
        return {
            "jobs": self.jobs,
            "units": sum(len(r.units) for r in runs),
            "units_computed": sum(len(r.computed) for r in runs),
            "units_resumed": sum(len(r.units) - len(r.computed) for r in runs),
            "compute_wall_s": sum(r.wall_s for r in runs),
            "units_seconds": float(sum(sum(r.seconds.values()) for r in runs)),
            "units_cpu_s": float(sum(sum(r.cpu_s.values()) for r in runs)),
        } | extra


def _chain(
    compute: Callable, store: UnitStore, todo: Sequence[tuple], first: Any, chained: bool
) -> list[tuple[Hashable, str, Any, float, float]]:
    """Compute the units ``todo`` (``(key, file name, payload)``) in order, saving each at once;
    a unit of a chain gets the chain's first unit (``first``, None while that one runs)."""
    out = []
    for key, name, payload in todo:
        t0, c0 = time.perf_counter(), time.process_time()
        unit = compute(key, first) if chained else compute(key, *payload)
        store.save(name, unit)
        first = unit if first is None else first
        out.append((key, name, unit, time.perf_counter() - t0, time.process_time() - c0))
    return out


def _chain_packed(args: tuple) -> list:
    return _chain(*args)


def run_units(
    store: UnitStore,
    keys: Mapping[Hashable, str] | Sequence[Mapping[Hashable, str]],
    compute: Callable[[Any, Any], Any],
    *,
    jobs: int | None = None,
    progress: bool | str = True,
    desc: str = "units",
    threads: int = 1,
    torch_threads: bool = False,
    cost: Callable[[Any], float] | None = None,
    payload: Callable[[Any], Any] | None = None,
) -> Units:
    """Every unit of a study: loaded from ``store`` (``--resume``) or computed, each saved as
    soon as it is done.

    Units run here (``jobs`` 1, or one piece of work) or in ``jobs`` spawned workers of
    ``threads`` threads each (:func:`init_worker`), costliest first. Progress: a bar on a
    terminal, else one line per finished unit. Ctrl-C stops the workers; what was saved stays.

    Parameters
    ----------
    store : UnitStore
        Where the units are saved and, with ``--resume``, found.
    keys : mapping or sequence of mappings
        Unit key -> file name in ``units/``: one mapping of independent units, each computed as
        ``compute(key)`` (``compute(key, payload(key))`` with ``payload``); or a list of chains,
        whose units run in order in one process, each as ``compute(key, first)``, ``first``
        being the chain's first unit (its sweep chose what the others use; None while the
        first itself runs).
    compute : callable
        Computes one unit. With workers it must pickle (a module-level function, a partial of
        one, or an instance of a module-level class).
    jobs : int, optional
        Worker processes; default :func:`default_jobs` of the pieces of work.
    progress : bool or "lines"
        Show progress on stderr: a bar on a terminal, else one line per unit (always lines
        with ``"lines"``).
    desc : str
        The progress label (the study's name).
    threads : int
        BLAS threads per worker (and torch threads with ``torch_threads``).
    torch_threads : bool
        Set torch's threads in each worker too.
    cost : callable, optional
        ``cost(key)``, a unit's relative cost: the workers take the costliest first.
    payload : callable, optional
        ``payload(key)``: the data of that unit alone, shipped to its worker with it.

    Returns
    -------
    Units
        Every unit by key, in the order of ``keys``, and how they were obtained.

    Raises
    ------
    UsageError
        A saved unit was computed with other settings (``--resume``).

    Examples
    --------
    >>> import tempfile
    >>> from condreg_experiments._runner import UnitStore, run_units
    >>> store = UnitStore(tempfile.mkdtemp(), settings={"n": 2}, resume=False)
    >>> done = run_units(store, {1: "one", 2: "two"}, lambda k: k * k, jobs=1, progress=False)
    >>> done.units, done.timing()["units_computed"]
    ({1: 1, 2: 4}, 2)
    """
    chained = not isinstance(keys, Mapping)
    chains = [dict(chain) for chain in keys] if chained else [{k: n} for k, n in keys.items()]
    units: dict[Hashable, Any] = {}
    for chain in chains:
        for key, name in chain.items():
            if (saved := store.load(name)) is not None:
                units[key] = saved
    work = []
    for chain in chains:
        todo = [(k, n) for k, n in chain.items() if k not in units]
        todo = [(k, n, () if payload is None else (payload(k),)) for k, n in todo]
        first = units.get(next(iter(chain))) if chained else None
        if todo:
            work.append((compute, store, todo, first, chained))
    n_jobs = int(jobs) if jobs is not None else default_jobs(len(work))
    done = Units(units, [], n_jobs, 0.0, {}, {})
    start = time.perf_counter()
    bar = _progress(progress, desc, sum(len(chain) for chain in chains))
    for chain in chains:
        for key, name in chain.items():
            if key in units:
                bar(name)
    if n_jobs == 1 or len(work) <= 1:
        parts: Any = (_chain(*w) for w in work)
        pool = None
    else:
        if cost is not None:  # the longest first, so that no worker is left with it at the end
            work.sort(key=lambda w: -sum(cost(k) for k, _, _ in w[2]))
        context = multiprocessing.get_context("spawn")
        pool = context.Pool(min(n_jobs, len(work)), init_worker, (threads, torch_threads))
        parts = pool.imap_unordered(_chain_packed, work)
    try:
        for part in parts:
            for key, name, unit, seconds, cpu_s in part:
                units[key] = unit
                done.computed.append(key)
                done.seconds[key], done.cpu_s[key] = seconds, cpu_s
                bar(name, seconds)
    finally:
        if pool is not None:
            pool.terminate()
            pool.join()
    done.wall_s = time.perf_counter() - start
    bar(None)
    order = [k for chain in chains for k in chain]
    done.units = {k: units[k] for k in order}
    return done


def _progress(enabled: bool | str, desc: str, total: int) -> Callable[..., None]:
    """``tick(name, seconds)`` after each unit (``tick(name, None)`` for a resumed one,
    ``tick(None)`` at the end): a tqdm bar on a terminal, else (or with ``enabled="lines"``) one
    line per unit on stderr; nothing if not ``enabled``."""
    if not enabled or total == 0:
        return lambda name, seconds=None: None
    if enabled != "lines" and sys.stderr.isatty():
        from tqdm.auto import tqdm

        bar = tqdm(total=total, desc=desc, leave=False, file=sys.stderr, dynamic_ncols=True)
        return lambda name, seconds=None: bar.close() if name is None else bar.update()
    count = [0]

    def line(name: Any, seconds: float | None = None) -> None:
        if name is None:
            return
        count[0] += 1
        how = "reused" if seconds is None else f"done in {seconds:.0f} s"
        print(f"{desc}: {name} {how} ({count[0]}/{total})", file=sys.stderr, flush=True)

    return line
