"""``condreg reproduce ablation`` (docs/ablation.md): condreg's protocol, each of
:data:`RELEASED_SWITCHES` alone and all together (``released``), the ``minibatch`` switch split
into its parts, the step rule and Opt κ's variants tuned by a D_P-only rule, the released MNIST
protocol on its own data, and a ``max_step`` sweep; every run scored by two κ's. This module holds
the options, the plan and the order of the work (units: :mod:`.units`, report: :mod:`.report`)."""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import time
from dataclasses import dataclass
from typing import Any

from condreg.algorithm import METHOD_LABELS, METHODS
from condreg_experiments import UsageError, house_prices, mnist_pairs
from condreg_experiments import _report as rp
from condreg_experiments import options as opt
from condreg_experiments._runner import UnitStore
from condreg_experiments.ablation import factors as fc
from condreg_experiments.ablation.released import RELEASED_SWITCHES, SWITCHES_BY_DATASET

__all__ = ["HELP", "RELEASED_SWITCHES", "ABLATION_PAIRS", "QUICK_PAIRS", "MAX_STEPS", "METHODS"]
__all__ += ["LABELS", "DP_TOLERANCE", "add_arguments", "check_max_steps", "protocols", "run"]
__all__ += ["Plan", "Settings", "execute", "PARTS", "switches_of"]

HELP = "the paper's ranking explained: condreg's protocol → the released code's, switch by switch"

#: The MNIST (P, H) pairs of the full run, each both ways (0-1: the authors' logged run), and quick.
ABLATION_PAIRS: list[tuple[int, int]] = [
    pair for p, h in [(0, 1), (3, 8), (4, 9), (2, 7), (5, 6)] for pair in ((p, h), (h, p))
]
QUICK_PAIRS: list[tuple[int, int]] = [(0, 1)]

#: condreg's ``max_step`` values of the schedule sweep (0.3 is the default).
MAX_STEPS: tuple[float, ...] = (0.05, 0.1, 0.2, 0.3, 0.4)

#: The D_P-only rule: the largest ``max_step`` whose D_P loss is at most this above θ = I's head.
DP_TOLERANCE = 0.02

DATASETS = ("house", "mnist")

#: The methods and their names in tables and plots: condreg.algorithm's (Ours last).
LABELS = METHOD_LABELS

#: The ablation's parts: the released switches (with the default row and the max_step sweep),
#: the minibatch switch factored, the step rules, the released MNIST protocol on its own data.
PARTS: tuple[str, ...] = ("switches", "factors", "rules", "released_mnist")


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


def _part_list(text: str) -> list[str]:
    names = [t.strip() for t in text.split(",") if t.strip()]
    if not names or set(names) - set(PARTS) or len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(f"--parts: distinct names of {', '.join(PARTS)}")
    return names


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ablation's own options (the CLI adds ``--out``, ``--seeds`` and the like)."""
    from condreg_experiments.options import add_resume_option, parse_pairs, positive_int

    quick = (
        "house prices with 20 epochs and MNIST pair 0-1 with 15 epochs and 250 images per digit, "
        "one seed, fewer step-rule values: under 1 CPU-minute (the full run: about 20)"
    )
    parser.add_argument("--quick", action="store_true", help=quick)
    add_resume_option(parser, "unit (dataset, row, seed, pair)")
    switches = (
        "comma-separated released switches to try one at a time, and/or 'released' (all "
        "together); default: every one and released. Switches: " + ", ".join(RELEASED_SWITCHES)
    )
    steps = (
        "condreg's max_step values of the schedule sweep and of the step rule's tuning, "
        "comma-separated in (0, 0.5) (default: 0.05,0.1,0.2,0.3,0.4; 0.3 is always included)"
    )
    parts = (
        "comma-separated parts to run (default: all): switches (the released switches, the "
        "default row, the max_step sweep), factors (the minibatch switch split into its parts), "
        "rules (the step rule and Opt κ's variants), released_mnist (the released MNIST "
        "protocol on raw single-digit tasks)"
    )
    for flag, kind, text in [
        ("--switches", _protocol_list, switches),
        ("--pairs", parse_pairs, "MNIST (P, H) pairs, e.g. 0-1,3-8 (default: the fixed set of 10)"),
        ("--datasets", _dataset_list, "house,mnist (default: both)"),
        ("--parts", _part_list, parts),
        ("--jobs", positive_int, "worker processes " + opt.JOBS_DEFAULT),
        ("--max-steps", _step_list, steps),
    ]:
        parser.add_argument(flag, type=kind, default=None, help=text)


def protocols(names: list[str] | None, datasets) -> list[str]:
    """``["condreg", *names]`` (None: every switch, then ``released``); UsageError if one is bad."""
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


@dataclass(frozen=True)
class Settings(opt.StudySettings):
    """The ablation's options (``switches`` resolved to the protocols, condreg's first)."""

    STUDY = "ablation"

    datasets: tuple[str, ...] = DATASETS
    parts: tuple[str, ...] = PARTS
    switches: tuple[str, ...] | None = None  # None: every switch, then "released"
    max_steps: tuple[float, ...] = MAX_STEPS

    def checked(self) -> Settings:
        datasets, parts = self.datasets or DATASETS, self.parts
        if set(datasets) - set(DATASETS):
            raise UsageError(f"--datasets: choose from house,mnist; got {list(datasets)!r}")
        if not parts or set(parts) - set(PARTS) or len(set(parts)) != len(parts):
            raise UsageError(f"--parts: distinct names of {', '.join(PARTS)}; got {list(parts)!r}")
        switches = protocols(None if self.switches is None else list(self.switches), datasets)
        steps = check_max_steps(self.max_steps)
        return dataclasses.replace(self, datasets=datasets, switches=switches, max_steps=steps)


def run(
    out_dir: pathlib.Path,
    *,
    quick: bool = False,
    seeds: int = 1,
    progress: bool = True,
    pairs: list[tuple[int, int]] | None = None,
    jobs: int | None = None,
    resume: bool = False,
    **options: Any,
) -> dict[str, Any]:
    """Run the ablation; write results.json, table.md, ranking.png, factored.png,
    step_rules.png, schedule.png and units/. The released switches run on ``seeds`` seeds, the
    factored rows, the step rules and the released MNIST rows on max(3, ``seeds``) (quick: 1);
    ``options``: the fields of :class:`Settings`.

    Returns the results.json payload; UsageError or DataError (unusable house files) before work.

    >>> from condreg_experiments import ablation
    >>> ablation.protocols(["adam", "released"], ("house",))
    ['condreg', 'adam', 'released']
    """
    start = time.perf_counter()
    out_dir = rp.check_out_dir(out_dir)
    given = Settings.take(options)
    if options:
        raise UsageError(
            f"ablation: unknown option(s) {', '.join(sorted(options))}; it takes --switches, "
            "--pairs, --datasets, --parts, --jobs, --max-steps, --resume, --quick"
        )
    rp.check_positive("--seeds", seeds, integer=True)
    rp.check_positive("--jobs", jobs, integer=True)
    s = Settings.resolve(quick, given)
    pairs = opt.check_pairs(pairs, QUICK_PAIRS if quick else ABLATION_PAIRS)
    seed_list = rp.seed_list(seeds)
    factor_seeds = seed_list if quick else rp.seed_list(max(seeds, fc.FACTOR_SEEDS))
    plan = Plan(
        out_dir, quick, seed_list, list(s.switches), pairs, list(s.datasets), jobs, resume,
        progress, list(s.max_steps), parts=s.parts, factor_seeds=factor_seeds,
        factor_pairs=list(QUICK_PAIRS if quick else fc.FACTOR_PAIRS),
    )  # fmt: skip
    from condreg_experiments.ablation.units import load_data

    return execute(plan, load_data(plan), start)  # load_data: DataError before any work


@dataclass(frozen=True)
class Plan:
    """What one ablation run does (validated by :func:`condreg_experiments.ablation.run`)."""

    out_dir: pathlib.Path
    quick: bool
    seeds: list[int]
    protocols: list[str]
    pairs: list[tuple[int, int]]
    datasets: list[str]
    jobs: int | None
    resume: bool
    progress: bool
    max_steps: list[float]
    parts: tuple[str, ...] = PARTS
    factor_seeds: list[int] = dataclasses.field(default_factory=lambda: [0, 1, 2])
    factor_pairs: list[tuple[int, int]] = dataclasses.field(
        default_factory=lambda: list(fc.FACTOR_PAIRS)
    )
    raw_pairs: list[tuple[int, int]] = dataclasses.field(
        default_factory=lambda: list(fc.RELEASED_MNIST_PAIRS)
    )

    def schedule(self, dataset: str) -> dict[str, Any]:
        """condreg's default settings of ``dataset`` (the default experiments', quick or not)."""
        if dataset == "house":
            s = house_prices.Settings.resolve(self.quick, {})
            return {"epochs": s.epochs, "lr": s.lr}
        s = mnist_pairs.Settings.resolve(self.quick, {})
        keys = ("epochs", "lr", "pool", "min_pixel_activity", "n_positive", "negative_fraction")
        return {k: getattr(s, k) for k in keys}

    def rule_grid(self, dataset: str) -> dict[str, list[float]]:
        """The values each step-rule variant is tuned over (its max_step or learning rate)."""
        lrs = fc.QUICK_LR_GRID if self.quick else fc.LR_GRID
        steps = [0.1, 0.3] if self.quick else self.max_steps
        return {n: list(steps if r[4] == "max_step" else lrs) for n, r in fc.RULES.items()}

    def settings(self) -> dict[str, Any]:
        """What the units depend on (results.json's settings; --resume checks it)."""
        return {
            "quick": self.quick,
            "protocols": self.protocols,
            "datasets": self.datasets,
            "parts": list(self.parts),
            "pairs": [list(p) for p in self.pairs],
            "factor_pairs": [list(p) for p in self.factor_pairs],
            "factor_seeds": list(self.factor_seeds),
            "released_mnist_pairs": [list(p) for p in self.raw_pairs],
            "house": self.schedule("house"),
            "mnist": self.schedule("mnist"),
            "methods": list(METHODS),
            "factor_methods": list(fc.FACTOR_METHODS),
            "max_steps": self.max_steps,
            "rule_grid": {d: self.rule_grid(d) for d in self.datasets},
        }


def execute(plan: Plan, data: dict[str, Any], start: float) -> dict[str, Any]:
    """Run the default experiments and every unit (the step rules' chosen values last), then
    write the outputs."""
    from condreg_experiments.ablation import report
    from condreg_experiments.ablation import units as un

    defaults = un.default_experiments(plan)
    store = UnitStore(plan.out_dir, settings=plan.settings(), resume=plan.resume)
    done: dict[str, Any] = {}
    specs = un.unit_specs(plan, data)
    runs = [un.run_units(plan, data, specs, store, done)]
    chosen = {}
    if "rules" in plan.parts:
        for dataset in plan.datasets:
            chosen[dataset] = un.choose_rule_values(plan, dataset, done, specs)
            values = {name: [c["chosen"]] for name, c in chosen[dataset].items()}
            extra = un.rule_specs(plan, dataset, plan.factor_seeds[1:], values)
            extra = [(k, w, {**s, "key": k}) for k, w, s in extra]
            runs.append(un.run_units(plan, data, extra, store, done))
            specs += extra
    results = report.assemble(plan, data, defaults, [(k, s) for k, _, s in specs], done, chosen)
    results["timing"] = runs[0].timing(*runs[1:])
    return report.write(plan, plan.settings(), results, start, store)
