"""Command-line option types and option groups shared by the experiments' ``add_arguments``;
every type raises :class:`argparse.ArgumentTypeError`, which argparse reports as one line."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import Any

__all__ = ["parse_pairs", "positive_int", "positive_float", "fraction", "method_list"]
__all__ += ["add_linear_options", "add_resume_option"]


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


def _checked(convert: Callable[[str], Any], ok: Callable[[Any], bool], expected: str):
    """An argparse type: ``convert(text)`` if ``ok`` of it, else "expected ``expected``"."""

    def parse(text: str):
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
        if not ok(value):
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
        return value

    return parse


def _positive(value: float) -> bool:
    return value > 0 and math.isfinite(value)


positive_int = _checked(int, _positive, "a positive integer")
positive_float = _checked(float, _positive, "a positive finite number")
#: An argparse type: a number in [0, 1).
fraction = _checked(float, lambda value: 0 <= value < 1, "a fraction in [0, 1)")


def method_list(text: str) -> list[str]:
    """An argparse type: comma-separated, known, distinct method names."""
    from condreg_experiments import UsageError
    from condreg_experiments._report import check_methods

    try:
        return check_methods([m.strip() for m in text.split(",") if m.strip()])
    except UsageError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


#: How every study's ``--jobs`` defaults (condreg_experiments._runner.default_jobs).
JOBS_DEFAULT = "(default: the cores, at most 8 and at most half the pieces of work)"

#: The help text of every experiment's ``--methods``.
METHODS_HELP = "comma-separated subset of condreg,r_ill_only,opt_kappa,imma (default: all)"


def add_linear_options(p: argparse.ArgumentParser, *, epochs_default: str) -> None:
    """``--epochs``, ``--lr`` and ``--methods`` of the linear experiments."""
    p.add_argument(
        "--epochs",
        type=positive_int,
        help=f"training epochs (default: the paper's, {epochs_default})",
    )
    p.add_argument("--lr", type=positive_float, help="step size η (default: the paper's, 0.005)")
    p.add_argument("--methods", type=method_list, help=METHODS_HELP)


def add_resume_option(p: argparse.ArgumentParser, unit: str) -> None:
    """``--resume``: keep the ``unit``s (seeds, pairs) already finished in ``--out/units/``."""
    p.add_argument(
        "--resume",
        action="store_true",
        help=f"keep every {unit} already finished in --out/units/ with the same settings and "
        "compute only the rest (each one is saved there as soon as it is done)",
    )
