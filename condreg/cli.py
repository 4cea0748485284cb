"""The ``condreg`` command line: ``condreg reproduce STUDY [options]``.

The studies are not part of the library: each is found through the entry-point group
``condreg.studies`` (the distribution ``condreg-experiments``, ``pip install ./experiments`` from
a clone, declares the paper's seven). An entry point ``NAME = module`` names a module with
``HELP`` (one line), ``add_arguments(parser)`` and ``run(out_dir, *, quick, seeds, progress,
**options)`` that writes ``out_dir/results.json`` and ``table.md`` and returns the
``results.json`` payload; it raises :class:`UsageError` for bad input before any work, keeps the
finished units of a resumable run (one with ``--resume``) as ``out_dir/**/units/*.json``, and may
name in ``THREADS_OPTION`` the ``run`` keyword that ``--threads`` sets too.

Bad arguments, unusable data or an unwritable ``--out``: one line on stderr, exit status 2, no
output folder left behind. No study installed: one line saying how to install them, status 2.
Ctrl-C (SIGINT) or SIGTERM: one line saying how many finished units were kept and the
``--resume`` command that continues, exit status 130 (143 for SIGTERM)."""

from __future__ import annotations

import argparse
import contextlib
import itertools
import pathlib
import shlex
import signal
import sys
import time
from collections.abc import Sequence
from importlib.metadata import entry_points
from typing import Any

__all__ = ["main", "build_parser", "check_out_dir", "studies", "UsageError"]

#: The one line printed when no study is installed.
INSTALL_HINT = (
    "no study is installed; install the paper's studies with: pip install ./experiments "
    "(from a clone of condreg; the distribution condreg-experiments)"
)


class UsageError(ValueError):
    """Bad input to a study (an option, the data, ``--out``), raised before any work:
    ``condreg reproduce`` prints it in one line and exits with status 2."""


def studies() -> dict[str, Any]:
    """The installed studies, found through the entry-point group ``condreg.studies``.

    Returns
    -------
    dict
        Study name (``condreg reproduce NAME``) -> its :class:`importlib.metadata.EntryPoint`
        (``load()`` imports the study's module); empty when no study is installed.
    """
    return {ep.name: ep for ep in entry_points(group="condreg.studies")}


def check_out_dir(out_dir: str | pathlib.Path) -> pathlib.Path:
    """Check a study's output folder before any work, without creating it (a failed run leaves
    nothing behind): not a file, and writable (``out_dir`` and its ``units/`` if they exist, else
    the nearest existing parent), tried by creating and removing a file.

    Parameters
    ----------
    out_dir : str or pathlib.Path
        The output folder (``--out``).

    Returns
    -------
    pathlib.Path
        ``out_dir`` as a Path.

    Raises
    ------
    UsageError
        ``out_dir`` is a file, or no file can be created there (e.g. a read-only file system).
    """
    path = pathlib.Path(out_dir)
    if path.exists() and not path.is_dir():
        raise UsageError(f"--out {str(path)!r} exists and is not a directory")
    existing = next(p for p in (path, *path.parents, pathlib.Path.cwd()) if p.exists())
    if not existing.is_dir():
        raise UsageError(f"--out {str(path)!r}: {str(existing)!r} is not a directory")
    for folder in (existing, path / "units"):
        if folder.is_dir() and (problem := _not_writable(folder)):
            if folder == path:
                what = "is not writable"
            elif folder == path / "units":
                what = "has a units/ folder that is not writable"
            else:
                what = f"cannot be created in {str(folder)!r}"
            raise UsageError(f"--out {str(path)!r} {what}: {problem}")
    return path


def _not_writable(folder: pathlib.Path) -> str | None:
    """Why no file can be created in ``folder`` (the OSError's text), or None if one can."""
    import os
    import tempfile

    try:
        fd, name = tempfile.mkstemp(prefix=".condreg-write-test-", dir=folder)
    except OSError as exc:
        return exc.strerror or str(exc)
    os.close(fd)
    os.unlink(name)
    return None


def _count_units(out_dir: pathlib.Path) -> int:
    """The units saved under ``out_dir`` (``units/*.json`` there and in its sub-folders)."""
    return sum(1 for _ in out_dir.glob("**/units/*.json")) if out_dir.is_dir() else 0


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line on stderr (exit status 2)."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _positive_int(text: str) -> int:
    """An argparse type: an integer > 0 (argparse reports anything else in one line)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _add_common(p: argparse.ArgumentParser, name: str) -> None:
    """``--out``, ``--seeds``, ``--no-progress``, ``--threads``, unless the experiment has one."""
    seeds_help = "repeat with seeds 0..N-1 and report mean ± std (default 1)"
    common = {
        "--out": dict(type=pathlib.Path, help=f"output directory (default: results/{name}/)"),
        "--seeds": dict(type=_positive_int, default=1, help=seeds_help),
        "--no-progress": dict(dest="progress", action="store_false", help="no progress bars"),
        "--threads": dict(
            type=_positive_int,
            help="BLAS threads (default 1: the matrices here are small, and one thread is as fast "
            "and never oversubscribes a busy machine); for deepnet also torch's intra-op threads",
        ),
    }
    for flag, kwargs in common.items():
        with contextlib.suppress(argparse.ArgumentError):  # declared by the experiment itself
            p.add_argument(flag, **kwargs)


def _add_experiment(exps, name: str, entry: Any) -> None:
    """The sub-command of one study; one that cannot be imported reports why (exit 2)."""
    try:
        module = entry.load()
    except (ImportError, UsageError) as exc:
        p = exps.add_parser(name, help=f"(unavailable: {exc})")
        p.set_defaults(unavailable=" ".join(str(exc).split()) or type(exc).__name__)
        return
    p = exps.add_parser(name, help=module.HELP, description=module.HELP)
    module.add_arguments(p)
    _add_common(p, name)
    p.set_defaults(module=module)


def build_parser() -> argparse.ArgumentParser:
    """The ``condreg`` parser: one sub-command per installed study (:func:`studies`)."""
    from condreg import __version__

    parser = _Parser(
        prog="condreg",
        description="condreg: condition-number regularizers and model immunization (ICML 2025).",
    )
    parser.add_argument("--version", action="version", version=f"condreg {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    rep = sub.add_parser(
        "reproduce",
        help="reproduce one of the paper's experiments",
        description="Reproduce one of the paper's experiments (docs/reproduction.md of the "
        "source distribution).",
    )
    exps = rep.add_subparsers(dest="experiment", required=True, metavar="EXPERIMENT")
    for name, entry in studies().items():
        _add_experiment(exps, name, entry)
    return parser


def _options(args: argparse.Namespace) -> dict[str, Any]:
    skip = {"command", "experiment", "out", "seeds", "quick", "progress", "threads", "unavailable"}
    skip.add("module")
    return {
        k: v
        for k, v in vars(args).items()
        if k not in skip and v is not None and not (k == "resume" and v is False)
    }


@contextlib.contextmanager
def _blas_threads(n: int):
    """Limit BLAS/OpenMP threads to ``n`` for the run (threadpoolctl; no-op without it)."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover
        yield
        return
    import scipy.linalg  # noqa: F401  (so that the limit covers SciPy's own OpenBLAS too)

    with threadpool_limits(limits=n):
        yield


class _Terminated(BaseException):
    """SIGTERM, raised in the main thread so that a run unwinds as it does for Ctrl-C."""


def _terminate(signum, frame):
    raise _Terminated(signum)


def _interrupted(name: str, out: pathlib.Path, argv: Sequence[str], resumable: bool) -> str:
    """The one line of an interrupted run: the units kept in ``out`` and how to continue."""
    kept = _count_units(out)
    if not resumable:
        return f"condreg reproduce {name}: interrupted; this experiment keeps nothing (no --resume)"
    again = list(argv) + ([] if "--resume" in argv else ["--resume"])
    where = f" under {out}/" if kept else ""
    return (
        f"condreg reproduce {name}: interrupted; {kept} finished unit(s) kept{where}; "
        f"continue with: condreg {shlex.join(again)}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``condreg`` console script; returns the exit status (2: bad input,
    130: interrupted by Ctrl-C, 143: by SIGTERM)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["reproduce"] and not studies():
        print(f"condreg reproduce: {INSTALL_HINT}", file=sys.stderr)
        return 2
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    name = args.experiment
    if getattr(args, "unavailable", None):  # the experiment's module cannot be imported here
        print(f"condreg reproduce {name}: error: {args.unavailable}", file=sys.stderr)
        return 2
    if extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    out = args.out if args.out is not None else pathlib.Path("results") / name
    options = _options(args)
    module = args.module
    if getattr(module, "THREADS_OPTION", None) and args.threads is not None:
        options[module.THREADS_OPTION] = args.threads
    created = list(itertools.takewhile(lambda p: not p.exists(), (out, *out.parents)))
    start = time.perf_counter()
    # SIGTERM unwinds like Ctrl-C: the units finished so far stay in --out for --resume
    try:
        previous = signal.signal(signal.SIGTERM, _terminate)
    except ValueError:  # not the main thread: leave signals alone
        previous = None
    stopped = None
    try:
        check_out_dir(out)  # an unwritable --out is found before any work
        with _blas_threads(args.threads or 1):
            kw = dict(quick=getattr(args, "quick", False), seeds=args.seeds, progress=args.progress)
            payload = module.run(out, **kw, **options)
        created = []  # a finished run keeps its folders
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError, UsageError) as exc:
        return _error(name, exc, 2)
    except OSError as exc:  # e.g. the disk filled up during the run: what was saved stays
        return _error(name, exc, 1)
    except KeyboardInterrupt:
        stopped = 128 + signal.SIGINT
    except _Terminated as exc:
        stopped = 128 + exc.args[0]
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        for folder in created:  # deepest first: the folders a failed run left empty
            with contextlib.suppress(OSError):
                folder.rmdir()
    if stopped is not None:  # after the except block: progress bars are closed by now
        print(_interrupted(name, out, argv, hasattr(args, "resume")), file=sys.stderr)
        return stopped
    return _summary(name, out, payload, time.perf_counter() - start, getattr(args, "lr", None))


def _error(name: str, exc: BaseException, status: int) -> int:
    """Print ``exc`` as one line on stderr and return ``status``."""
    message = " ".join(str(exc).split())  # one line, whatever the message holds
    print(f"condreg reproduce {name}: error: {message}", file=sys.stderr)
    return status


def _summary(name: str, out: pathlib.Path, payload: Any, elapsed: float, lr: float | None) -> int:
    """Print a finished run's table and notes; status 2 when every run stopped early."""
    table = out / "table.md"
    shown = table.read_text(encoding="utf-8") if table.is_file() else ""
    if shown:
        print(shown)
    print(f"[{name}] wrote {out}/ (results.json, table.md, plots) in {elapsed:.1f} s")
    if not isinstance(payload, dict):
        return 0
    for note in payload.get("notes") or ():
        if note not in shown:  # the tables list their notes already
            print(f"note: {note}")
    early = (payload.get("results") or {}).get("stopped_early")
    if early and early["total"] and early["early"] == early["total"]:
        hint = f" (--lr {lr:g}; the paper's is 0.005)" if lr else ""
        print(
            f"condreg reproduce {name}: error: every run stopped early{hint}: "
            f"{'; '.join(early['reasons'][:2])}; results kept in {out}/",
            file=sys.stderr,
        )
        return 2
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
