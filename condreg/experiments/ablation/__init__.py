"""Ablation: from condreg's protocol to the released code's, one switch at a time.

``condreg reproduce ablation`` trains the four methods on house prices and a fixed set of MNIST
digit pairs under condreg's default protocol (the ``house-prices`` and ``mnist-pairs``
experiments themselves, run into ``default-house-prices/`` and ``default-mnist-pairs/``), under
each of the released code's choices switched on alone (:data:`RELEASED_SWITCHES`, emulated by
:func:`condreg.experiments.ablation.emulator.emulate` inside this experiment only), and under all
of them together (``released``: the released protocol as far as its code defines it). Every run
is scored two ways: κ over the nonzero singular values (condreg's) and the released ridge-floor κ
(``eigvalsh(S + 1e-6·I)``, σ_min the smallest eigenvalue above 1e-6), with the inputs' κ(K_P),
κ(K_H) at θ = I under both scorings and both house-price preprocessings, beside what the authors
logged (:data:`~.released.LOGGED`). It also sweeps condreg's ``max_step`` and reads RIR against
the epoch (schedule-independent verdicts) and picks ``max_step`` by a rule that looks only at D_P.

Writes ``results.json``, ``table.md``, ``ranking.png`` (which switch moves the Ours-vs-Opt κ
ranking), ``schedule.png`` (RIR against epochs and ``max_step``) and ``units/`` (resumable).
docs/ablation.md explains the switches, the two scorings and the table.
"""

from __future__ import annotations

import argparse
import pathlib
import time
from typing import Any

from condreg.experiments import UsageError
from condreg.experiments.ablation.released import RELEASED_SWITCHES, SWITCHES_BY_DATASET

__all__ = [
    "HELP",
    "RELEASED_SWITCHES",
    "ABLATION_PAIRS",
    "QUICK_PAIRS",
    "MAX_STEPS",
    "DP_TOLERANCE",
    "add_arguments",
    "check_max_steps",
    "protocols",
    "run",
]

HELP = "the paper's ranking explained: condreg's protocol → the released code's, switch by switch"

#: The MNIST (P, H) pairs of the full run (both orders of five digit pairs; 0-1 is the pair of
#: the authors' logged MNIST run) and of ``--quick``.
ABLATION_PAIRS: list[tuple[int, int]] = [
    (0, 1), (1, 0), (3, 8), (8, 3), (4, 9), (9, 4), (2, 7), (7, 2), (5, 6), (6, 5),
]  # fmt: skip
QUICK_PAIRS: list[tuple[int, int]] = [(0, 1), (3, 8)]

#: condreg's ``max_step`` values of the schedule sweep (0.3 is the default).
MAX_STEPS: tuple[float, ...] = (0.05, 0.1, 0.2, 0.3, 0.4)

#: The D_P-only rule: the largest ``max_step`` whose D_P loss after training is at most this
#: much above the loss of the head trained alone on θ = I (same epochs and step).
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
    bad = [n for n in names if n not in DATASETS]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"--datasets: choose from house,mnist; got {text!r}")
    return names


def _step_list(text: str) -> list[float]:
    try:
        return check_max_steps([float(t) for t in text.split(",") if t.strip()])
    except (ValueError, UsageError) as exc:
        raise argparse.ArgumentTypeError(f"--max-steps: {exc}") from None


def check_max_steps(values) -> list[float]:
    """The sweep's ``max_step`` values, sorted, with the default 0.3; each in (0, 0.5)
    (:class:`condreg.experiments.UsageError` otherwise)."""
    values = [float(v) for v in values]
    bad = [v for v in values if not 0 < v < 0.5]
    if bad or not values:
        raise UsageError(f"--max-steps: values must lie in (0, 0.5), got {values!r}")
    return sorted({*values, 0.3})


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ablation's own options (the CLI adds ``--out``, ``--seeds``, ``--no-progress``,
    ``--threads``)."""
    from condreg.experiments.options import add_resume_option, parse_pairs, positive_int

    parser.add_argument(
        "--quick",
        action="store_true",
        help="house prices with 20 epochs and 2 MNIST pairs (0-1, 3-8) with 15 epochs and 250 "
        "images per digit, instead of 100 / 10 pairs / 30 epochs; about 1-2 minutes on 2 cores",
    )
    add_resume_option(parser, "unit (dataset, protocol, seed, pair)")
    parser.add_argument(
        "--switches",
        type=_protocol_list,
        default=None,
        help="comma-separated released switches to try one at a time, and/or 'released' (all "
        f"together); default: every one and released. Switches: {', '.join(RELEASED_SWITCHES)}",
    )
    parser.add_argument(
        "--pairs",
        type=parse_pairs,
        default=None,
        help="MNIST (P, H) pairs, e.g. 0-1,3-8 (default: the fixed set of 10)",
    )
    parser.add_argument(
        "--datasets", type=_dataset_list, default=None, help="house,mnist (default: both)"
    )
    parser.add_argument(
        "--jobs", type=positive_int, default=None, help="worker processes (default: the cores)"
    )
    parser.add_argument(
        "--max-steps",
        type=_step_list,
        default=None,
        help="condreg's max_step values of the schedule sweep, comma-separated in (0, 0.5) "
        "(default: 0.05,0.1,0.2,0.3,0.4; the default 0.3 is always included)",
    )


def protocols(names: list[str] | None, datasets) -> list[str]:
    """The protocols to run: ``"condreg"`` first, then each named switch, then ``"released"``.

    ``names`` None: every switch and ``released``. A name is a switch of
    :data:`RELEASED_SWITCHES` or ``released`` (all switches together); ``a+b`` combinations are
    refused: the released code had all its choices at once and condreg none, so a partial
    combination is neither protocol. Raises :class:`condreg.experiments.UsageError`."""
    if names is None:
        return ["condreg", *RELEASED_SWITCHES, "released"]
    out = ["condreg"]
    for name in names:
        if "+" in name:
            raise UsageError(
                f"--switches {name!r}: the released code never had that combination of choices; "
                f"name single switches (each is tried alone) or 'released' (all together)"
            )
        if name not in RELEASED_SWITCHES and name != "released":
            raise UsageError(
                f"--switches: unknown switch {name!r}; choose from "
                f"{', '.join(RELEASED_SWITCHES)}, released"
            )
        if name == "released_preprocessing" and "house" not in datasets:
            raise UsageError(
                "--switches released_preprocessing: the released code preprocesses only the "
                "house prices that way; add --datasets house"
            )
        if name in out:
            raise UsageError(f"--switches lists {name!r} twice")
        out.append(name)
    return out


def switches_of(protocol: str, dataset: str) -> list[str]:
    """The switches a protocol turns on for ``dataset`` (``released``: all that exist there)."""
    if protocol == "condreg":
        return []
    if protocol == "released":
        return list(SWITCHES_BY_DATASET[dataset])
    return [protocol] if protocol in SWITCHES_BY_DATASET[dataset] else []


def _check(seeds, pairs, datasets, jobs, options) -> None:
    from condreg.experiments import _report as rp

    if options:
        raise UsageError(
            f"ablation: unknown option(s) {', '.join(sorted(options))}; it takes --switches, "
            f"--pairs, --datasets, --jobs, --resume, --quick"
        )
    rp.check_positive("--seeds", seeds, integer=True)
    rp.check_positive("--jobs", jobs, integer=True)
    if datasets is not None and (not datasets or set(datasets) - set(DATASETS)):
        raise UsageError(f"--datasets: choose from house,mnist; got {datasets!r}")
    if pairs is not None:
        keys = [tuple(p) for p in pairs]
        bad = [p for p in keys if len(p) != 2 or p[0] == p[1] or not set(p) <= set(range(10))]
        if bad or not keys or len(set(keys)) != len(keys):
            raise UsageError(f"--pairs needs distinct (P, H) digit pairs 0-9, got {pairs!r}")


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

    Parameters
    ----------
    out_dir : path — the output folder (created when the first output is written).
    quick : the small version (house 20 epochs; MNIST pairs 0-1, 3-8, 15 epochs, 250 images
        per digit). seeds : seeds 0 … seeds−1. progress : a progress bar on stderr.
    switches : switch names and/or ``"released"`` (default: all; :func:`protocols`).
    pairs : MNIST pairs (default :data:`ABLATION_PAIRS`, quick :data:`QUICK_PAIRS`).
    datasets : ``["house", "mnist"]`` (default both). jobs : worker processes.
    max_steps : the schedule sweep's ``max_step`` values (default :data:`MAX_STEPS`; 0.3, the
        default, always runs).
    resume : keep the units already in ``out_dir/units/`` with the same settings.

    Returns
    -------
    dict — the results.json payload.

    Raises
    ------
    condreg.experiments.UsageError
        A bad option (unknown switch, a combination the released code never had, bad pairs).
    condreg.experiments.data.DataError
        House-price files that cannot be preprocessed the released way.
    Both are raised before any work.

    Examples
    --------
    >>> from condreg.experiments import ablation
    >>> ablation.protocols(["adam", "released"], ("house",))
    ['condreg', 'adam', 'released']
    """
    from condreg.experiments import _report as rp
    from condreg.experiments.ablation import study

    start = time.perf_counter()
    out_dir = rp.check_out_dir(out_dir)
    datasets = list(datasets or DATASETS)
    _check(seeds, pairs, datasets, jobs, options)
    names = protocols(switches, datasets)
    steps = check_max_steps(MAX_STEPS if max_steps is None else max_steps)
    pairs = [tuple(p) for p in (pairs or (QUICK_PAIRS if quick else ABLATION_PAIRS))]
    plan = study.Plan(
        out_dir=out_dir, quick=quick, seeds=rp.seed_list(seeds), protocols=names,
        pairs=pairs, datasets=datasets, jobs=jobs, resume=resume, progress=progress,
        max_steps=steps,
    )  # fmt: skip
    data = study.load_data(plan)  # DataError before any work
    return study.execute(plan, data, start)
