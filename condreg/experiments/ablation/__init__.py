"""Ablation: from condreg's protocol to the released code's, one switch at a time.

``condreg reproduce ablation`` trains the four methods under condreg's protocol, under each of
:data:`RELEASED_SWITCHES` alone and under all of them (``released``), scores every run by two κ's
and sweeps ``max_step``; docs/ablation.md explains the switches, the scorings and the outputs.
"""

from __future__ import annotations

import argparse
import pathlib
import time
from typing import Any

from condreg.experiments import UsageError
from condreg.experiments.ablation.released import RELEASED_SWITCHES, SWITCHES_BY_DATASET

__all__ = ["HELP", "RELEASED_SWITCHES", "ABLATION_PAIRS", "QUICK_PAIRS", "MAX_STEPS"]
__all__ += ["DP_TOLERANCE", "add_arguments", "check_max_steps", "protocols", "run"]

HELP = "the paper's ranking explained: condreg's protocol → the released code's, switch by switch"

#: The MNIST (P, H) pairs of the full run, each both ways (0-1: the authors' logged run), and of
#: ``--quick``.
ABLATION_PAIRS: list[tuple[int, int]] = [
    pair for p, h in [(0, 1), (3, 8), (4, 9), (2, 7), (5, 6)] for pair in ((p, h), (h, p))
]
QUICK_PAIRS: list[tuple[int, int]] = [(0, 1), (3, 8)]

#: condreg's ``max_step`` values of the schedule sweep (0.3 is the default).
MAX_STEPS: tuple[float, ...] = (0.05, 0.1, 0.2, 0.3, 0.4)

#: The D_P-only rule: the largest ``max_step`` whose D_P loss is at most this much above the
#: head trained alone on θ = I.
DP_TOLERANCE = 0.02

DATASETS = ("house", "mnist")


def _protocol_list(text: str) -> list[str]:
    """An argparse type for ``--switches``: comma-separated switch names or ``released``."""
    try:
        return protocols([t.strip() for t in text.split(",") if t.strip()], DATASETS)[1:]
    except UsageError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _dataset_list(text: str) -> list[str]:
    names = [t.strip() for t in text.split(",") if t.strip()]
    if not names or set(names) - set(DATASETS):
        raise argparse.ArgumentTypeError(f"--datasets: choose from house,mnist; got {text!r}")
    return names


def _step_list(text: str) -> list[float]:
    try:
        return check_max_steps([float(t) for t in text.split(",") if t.strip()])
    except (ValueError, UsageError) as exc:
        raise argparse.ArgumentTypeError(f"--max-steps: {exc}") from None


def check_max_steps(values) -> list[float]:
    """The sweep's ``max_step`` values (each in (0, 0.5), else UsageError), sorted, with 0.3."""
    values = [float(v) for v in values]
    if not values or not all(0 < v < 0.5 for v in values):
        raise UsageError(f"--max-steps: values must lie in (0, 0.5), got {values!r}")
    return sorted({*values, 0.3})


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ablation's own options (the CLI adds ``--out``, ``--seeds`` and the like)."""
    from condreg.experiments.options import add_resume_option, parse_pairs, positive_int

    quick = (
        "house prices with 20 epochs and 2 MNIST pairs (0-1, 3-8) with 15 epochs and 250 images "
        "per digit, instead of 100 / 10 pairs / 30 epochs; about 1-2 minutes on 2 cores"
    )
    parser.add_argument("--quick", action="store_true", help=quick)
    add_resume_option(parser, "unit (dataset, protocol, seed, pair)")
    switches = (
        "comma-separated released switches to try one at a time, and/or 'released' (all "
        "together); default: every one and released. Switches: " + ", ".join(RELEASED_SWITCHES)
    )
    steps = (
        "condreg's max_step values of the schedule sweep, comma-separated in (0, 0.5) (default: "
        "0.05,0.1,0.2,0.3,0.4; the default 0.3 is always included)"
    )
    for flag, kind, text in [
        ("--switches", _protocol_list, switches),
        ("--pairs", parse_pairs, "MNIST (P, H) pairs, e.g. 0-1,3-8 (default: the fixed set of 10)"),
        ("--datasets", _dataset_list, "house,mnist (default: both)"),
        ("--jobs", positive_int, "worker processes (default: the cores)"),
        ("--max-steps", _step_list, steps),
    ]:
        parser.add_argument(flag, type=kind, default=None, help=text)


def protocols(names: list[str] | None, datasets) -> list[str]:
    """``"condreg"``, then the named switches and/or ``"released"`` (``names`` None: all of them);
    raises :class:`condreg.experiments.UsageError` for a bad name or an ``a+b`` combination."""
    if names is None:
        return ["condreg", *RELEASED_SWITCHES, "released"]
    out, known = ["condreg"], [*RELEASED_SWITCHES, "released"]
    for name in names:
        if "+" in name:
            raise UsageError(
                f"--switches {name!r}: the released code never had that combination of choices; "
                "name single switches (each is tried alone) or 'released' (all together)"
            )
        if name not in known:
            raise UsageError(f"--switches: unknown switch {name!r}; choose from {', '.join(known)}")
        if name == "released_preprocessing" and "house" not in datasets:
            raise UsageError(
                "--switches released_preprocessing: the released code preprocesses only the house "
                "prices that way; add --datasets house"
            )
        if name in out:
            raise UsageError(f"--switches lists {name!r} twice")
        out.append(name)
    return out


def switches_of(protocol: str, dataset: str) -> list[str]:
    """The switches a protocol turns on for ``dataset`` (``released``: all that exist there)."""
    if protocol == "released":
        return list(SWITCHES_BY_DATASET[dataset])
    return [protocol] if protocol in SWITCHES_BY_DATASET[dataset] else []


def run(
    out_dir: pathlib.Path,
    *,
    quick: bool = False,
    seeds: int = 1,
    progress: bool = True,
    switches: list[str] | None = None,
    pairs: list[tuple[int, int]] | None = None,
    datasets: list[str] | None = None,
    jobs: int | None = None,
    max_steps: list[float] | None = None,
    resume: bool = False,
    **options: Any,
) -> dict[str, Any]:
    """Run the ablation and write results.json, table.md, ranking.png, schedule.png, units/.

    Defaults: every switch and ``released`` (:func:`protocols`), :data:`ABLATION_PAIRS` (quick:
    :data:`QUICK_PAIRS`), :data:`MAX_STEPS`. Returns the results.json payload; raises UsageError
    (a bad option) or DataError (house files the released way cannot use) before any work.

    >>> from condreg.experiments import ablation
    >>> ablation.protocols(["adam", "released"], ("house",))
    ['condreg', 'adam', 'released']
    """
    from condreg.experiments import _report as rp
    from condreg.experiments.ablation import study

    start = time.perf_counter()
    out_dir = rp.check_out_dir(out_dir)
    datasets = list(datasets or DATASETS)
    if options:
        raise UsageError(
            f"ablation: unknown option(s) {', '.join(sorted(options))}; it takes "
            f"--switches, --pairs, --datasets, --jobs, --resume, --quick"
        )
    rp.check_positive("--seeds", seeds, integer=True)
    rp.check_positive("--jobs", jobs, integer=True)
    if set(datasets) - set(DATASETS):
        raise UsageError(f"--datasets: choose from house,mnist; got {datasets!r}")
    if pairs is not None:
        keys = [tuple(p) for p in pairs]
        bad = [p for p in keys if len(p) != 2 or p[0] == p[1] or not set(p) <= set(range(10))]
        if bad or not keys or len(set(keys)) != len(keys):
            raise UsageError(f"--pairs needs distinct (P, H) digit pairs 0-9, got {pairs!r}")
    protocol_names = protocols(switches, datasets)
    steps = check_max_steps(MAX_STEPS if max_steps is None else max_steps)
    pairs = [tuple(p) for p in (pairs or (QUICK_PAIRS if quick else ABLATION_PAIRS))]
    seed_list = rp.seed_list(seeds)
    plan = study.Plan(
        out_dir, quick, seed_list, protocol_names, pairs, datasets, jobs, resume, progress, steps
    )
    data = study.load_data(plan)  # DataError before any work
    return study.execute(plan, data, start)
