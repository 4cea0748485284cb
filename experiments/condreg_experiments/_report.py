"""Shared reporting helpers of the experiments: output folders, seeds, progress bars, number
formatting, ``results.json`` / ``table.md`` and headless Matplotlib figures (no ``pyplot``)."""

from __future__ import annotations

import datetime as _dt
import json
import math
import pathlib
import platform
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

import condreg
from condreg.algorithm import METHOD_LABELS as _LABELS
from condreg.algorithm import METHODS
from condreg.cli import UsageError, check_out_dir  # noqa: F401 (the studies use rp.check_out_dir)

#: Display names in tables and plots: condreg.algorithm.METHOD_LABELS (the methods, in
#: condreg.algorithm.METHODS order) and "identity", θ = I, the un-immunized reference.
METHOD_LABELS: dict[str, str] = {"identity": "Identity (θ = I)", **_LABELS}

#: One fixed tab10 colour per method, the same in every figure.
METHOD_COLORS: dict[str, str] = {
    "identity": "tab:gray",
    "r_ill_only": "tab:orange",
    "imma": "tab:purple",
    "opt_kappa": "tab:green",
    "condreg": "tab:blue",
    "theta0": "tab:gray",
    "no_immunization": "tab:gray",
    "r_well_only": "tab:red",
}

#: Table 1 of the paper (house prices), as reported (docs/math.md §8): (i), (ii), RIR.
PAPER_HOUSE_PRICES: dict[str, dict[str, float]] = {
    "r_ill_only": {"i": 90.02, "ii": 72.42, "rir": 1.24},
    "imma": {"i": 7.05, "ii": 3.55, "rir": 2.00},
    "opt_kappa": {"i": 1.52, "ii": 0.016, "rir": 92.58},
    "condreg": {"i": 18.92, "ii": 0.053, "rir": 356.2},
}

#: Table 2 / Fig. 2 of the paper (MNIST, 90 ordered digit pairs), as reported (docs/math.md §8):
#: mean RIR over the pairs and the number of pairs the paper counts as a success.
PAPER_MNIST: dict[str, dict[str, float | None]] = {
    "r_ill_only": {"mean_rir": 1.93, "successes": 0},
    "imma": {"mean_rir": 1.77, "successes": 1},
    "opt_kappa": {"mean_rir": 69.73, "successes": 90 - 32},
    "condreg": {"mean_rir": 70.04, "successes": 90, "min_rir": 8.6, "max_rir": 523.0},
}

#: Table 3 of the paper (deep nets, ImageNet as D_P), as reported (docs/math.md §8).
PAPER_DEEPNET: dict[str, dict[str, float]] = {
    "resnet18_cars": {"rir_theta0": 3.47, "acc_before": 68.24, "acc_after": 62.36},
    "resnet18_country211": {"rir_theta0": 8.71, "acc_before": 68.24, "acc_after": 65.01},
    "vit_cars": {"rir_theta0": 34.5, "acc_before": 81.78, "acc_after": 82.79},
    "vit_country211": {"rir_theta0": 41.3, "acc_before": 81.78, "acc_after": 83.17},
}


def check_methods(methods: Sequence[str] | None) -> list[str]:
    """The methods to run: all of :data:`METHODS` for None, else known, distinct names."""
    if methods is None:
        return list(METHODS)
    names = [str(m) for m in methods]
    if not names:
        raise UsageError(f"--methods is empty; choose one or more of {', '.join(METHODS)}")
    bad = [m for m in names if m not in METHODS]
    if bad:
        raise UsageError(f"unknown method(s) {', '.join(bad)}; choose from {', '.join(METHODS)}")
    twice = sorted({m for m in names if names.count(m) > 1})
    if twice:
        raise UsageError(
            f"--methods lists {', '.join(twice)} more than once (use --seeds N to repeat a run)"
        )
    return names


def check_positive(name: str, value: float | None, *, integer: bool = False) -> None:
    """Raise UsageError unless ``value`` is None or a finite number > 0 (integer if ``integer``)."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise UsageError(f"{name} must be a number, got {value!r}")
    if integer and int(value) != value:
        raise UsageError(f"{name} must be a positive integer, got {value!r}")
    if not (math.isfinite(float(value)) and value > 0):
        kind = "integer" if integer else "finite number"
        raise UsageError(f"{name} must be a positive {kind}, got {value!r}")


def prepare_out_dir(out_dir: str | pathlib.Path) -> pathlib.Path:
    """Create ``out_dir`` (and parents) if needed and return it as a Path."""
    path = pathlib.Path(out_dir)
    if path.exists() and not path.is_dir():
        raise NotADirectoryError(f"--out {str(path)!r} exists and is not a directory")
    path.mkdir(parents=True, exist_ok=True)
    return path


def immunize_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """The settings entries of the options passed on to :func:`condreg.immunize`."""
    default = "default (condreg.immunize)"
    lams = {k: options.get(k, default) for k in ("lam_p", "lam_h")}
    return lams | {"options": {k: v for k, v in options.items() if k not in lams}}


def seed_list(seeds: int) -> list[int]:
    """The seeds ``0, 1, …, seeds - 1`` of a repeated run (``seeds >= 1``)."""
    if int(seeds) < 1:
        raise ValueError(f"--seeds must be >= 1, got {seeds}")
    return list(range(int(seeds)))


def progress(
    iterable: Iterable[Any],
    *,
    enabled: bool = True,
    desc: str | None = None,
    total: int | None = None,
) -> Iterable[Any]:
    """Wrap ``iterable`` in a tqdm progress bar on stderr when ``enabled`` (else return it)."""
    if not enabled:
        return iterable
    try:
        from tqdm.auto import tqdm
    except ImportError:  # pragma: no cover - tqdm is in the experiments extra
        return iterable
    return tqdm(iterable, desc=desc, total=total, leave=False, file=sys.stderr, dynamic_ncols=True)


def mean_std(values: Sequence[float] | np.ndarray) -> dict[str, Any]:
    """``{"mean", "std", "n", "values"}``, std with ``ddof=1`` (0 for one value); NaNs propagate."""
    arr = np.asarray(values, dtype=float).reshape(-1)
    if arr.size == 0:
        raise ValueError("mean_std needs at least one value")
    std = float(np.std(arr, ddof=1)) if arr.size > 1 else 0.0
    return {"mean": float(np.mean(arr)), "std": std, "n": int(arr.size), "values": arr.tolist()}


def geomean(values: Iterable[float]) -> float:
    """``exp(mean(log v))`` over the finite, positive ``values`` (NaN when there are none).

    Ratios of condition numbers span orders of magnitude: their average is geometric.

    >>> round(geomean([1.0, 100.0]), 9)  # the arithmetic mean would be 50.5
    10.0
    """
    v = np.asarray(list(values), dtype=float).reshape(-1)
    v = v[np.isfinite(v) & (v > 0)]
    return float(np.exp(np.mean(np.log(v)))) if v.size else float("nan")


def ratio_summary(values: Sequence[float] | np.ndarray) -> dict[str, Any]:
    """A ratio's summary over runs: ``{"geomean", "median", "gsd", "min", "max", "n",
    "n_invalid", "values"}`` — geometric mean and standard deviation ``exp(std(log v, ddof=1))``
    over the finite positive values (``n_invalid`` counts the others), median over all."""
    arr = np.asarray(values, dtype=float).reshape(-1)
    if arr.size == 0:
        raise ValueError("ratio_summary needs at least one value")
    ok = arr[np.isfinite(arr) & (arr > 0)]
    logs = np.log(ok)
    gsd = float(np.exp(np.std(logs, ddof=1))) if ok.size > 1 else 1.0
    finite = arr[~np.isnan(arr)]
    return {
        "geomean": geomean(ok),
        "median": float(np.median(finite)) if finite.size else float("nan"),
        "gsd": gsd,
        "min": float(np.min(finite)) if finite.size else float("nan"),
        "max": float(np.max(finite)) if finite.size else float("nan"),
        "n": int(arr.size),
        "n_invalid": int(arr.size - ok.size),
        "values": arr.tolist(),
    }


def fmt_ratio(summary: Mapping[str, Any] | float | None, digits: int = 4) -> str:
    """``"geomean ×/÷ gsd"`` for a :func:`ratio_summary` of n > 1, else the number itself."""
    return _fmt_summary(summary, digits, "geomean", "×/÷", "gsd")


def _fmt_summary(summary, digits: int, center: str, sign: str, spread: str) -> str:
    """``"center sign spread"`` of a summary with n > 1, its center for n = 1, a number as is."""
    if summary is None or not isinstance(summary, Mapping):
        return fmt_number(summary, digits)
    if summary.get("n", 1) > 1:
        return f"{fmt_number(summary[center], digits)} {sign} {fmt_number(summary[spread], 2)}"
    return fmt_number(summary[center], digits)


#: Definition 3.1 (a) asks (i) ≫ 1: successes ((ii) ≤ 1 as well) are counted at (i) > 1, ≥ 2, ≥ 10.
I_THRESHOLDS: dict[str, tuple[float, bool]] = {
    "i>1": (1.0, False),
    "i>=2": (2.0, True),
    "i>=10": (10.0, True),
}


def success_by_i(i: float, ii: float) -> dict[str, bool]:
    """Definition 3.1 (a) + (b) at each of :data:`I_THRESHOLDS`: ``(ii) ≤ 1`` and (i) above it.

    >>> success_by_i(3.0, 0.5)
    {'i>1': True, 'i>=2': True, 'i>=10': False}
    """
    ok = math.isfinite(i) and math.isfinite(ii) and ii <= 1
    return {
        key: bool(ok and (i >= t if inclusive else i > t))
        for key, (t, inclusive) in I_THRESHOLDS.items()
    }


def success_counts(pairs: Iterable[tuple[float, float]]) -> dict[str, int]:
    """How many ``(i, ii)`` runs succeed at each of :data:`I_THRESHOLDS`."""
    out = dict.fromkeys(I_THRESHOLDS, 0)
    for i, ii in pairs:
        for key, ok in success_by_i(i, ii).items():
            out[key] += ok
    return out


def fmt_number(x: float | None, digits: int = 4) -> str:
    """``digits`` significant digits; scientific notation for very large or small magnitudes."""
    if x is None:
        return "—"
    x = float(x)
    if not math.isfinite(x):
        return str(x)
    if x == 0:
        return "0"
    mag = abs(x)
    if mag >= 10 ** (digits + 2) or mag < 1e-3:
        return f"{x:.{max(digits - 1, 0)}e}"
    return f"{x:.{digits}g}" if mag < 10**digits else f"{x:.0f}"


def fmt_mean_std(summary: Mapping[str, Any] | float | None, digits: int = 4) -> str:
    """``"mean ± std"`` for a :func:`mean_std` summary with n > 1, else just the number."""
    return _fmt_summary(summary, digits, "mean", "±", "std")


def markdown_table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A GitHub-flavoured Markdown table; cells are ``str()``-ed (format numbers beforehand)."""
    headers = [str(h) for h in headers]
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    for row in rows:
        cells = [str(c).replace("|", "\\|") for c in row]
        if len(cells) != len(headers):
            raise ValueError(f"row has {len(cells)} cells, the header {len(headers)}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def to_jsonable(obj: Any) -> Any:
    """``obj`` as strict JSON; non-finite floats as ``"NaN"``, ``"Infinity"``, ``"-Infinity"``."""
    if isinstance(obj, Mapping):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return to_jsonable(obj.tolist())
    if isinstance(obj, (bool, np.bool_)):
        return bool(obj)
    if isinstance(obj, (int, np.integer)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        f = float(obj)
        return f if math.isfinite(f) else json.dumps(f)  # "NaN", "Infinity" or "-Infinity"
    if isinstance(obj, pathlib.PurePath):
        return str(obj)
    if obj is None or isinstance(obj, str):
        return obj
    return repr(obj)


def from_jsonable(obj: Any) -> Any:
    """Inverse of :func:`to_jsonable` for the non-finite float strings."""
    if isinstance(obj, dict):
        return {k: from_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [from_jsonable(v) for v in obj]
    if obj in ("NaN", "Infinity", "-Infinity"):
        return float(obj.replace("Infinity", "inf"))
    return obj


def _environment() -> dict[str, Any]:
    env: dict[str, Any] = {
        "condreg_version": condreg.__version__,
        "python": platform.python_version(),
        "numpy": np.__version__,
        "platform": platform.platform(),
    }
    for name in ("scipy", "matplotlib"):
        mod = sys.modules.get(name)
        if mod is not None:
            env[name] = getattr(mod, "__version__", "?")
    return env


def write_results(
    out_dir: str | pathlib.Path,
    *,
    experiment: str,
    settings: Mapping[str, Any],
    seeds: Sequence[int],
    results: Mapping[str, Any],
    runtime_s: float | None = None,
    notes: Sequence[str] = (),
) -> dict[str, Any]:
    """Write ``out_dir/results.json`` and return the payload written."""
    env = _environment()
    created = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    payload = to_jsonable(
        dict(experiment=experiment, condreg_version=env["condreg_version"], created_utc=created)
        | dict(environment=env, settings=dict(settings), seeds=list(seeds), runtime_s=runtime_s)
        | dict(notes=list(notes), results=results)
    )
    path = prepare_out_dir(out_dir) / "results.json"
    text = json.dumps(payload, indent=2, allow_nan=False, ensure_ascii=False)
    path.write_text(text + "\n", encoding="utf-8")
    return payload


def write_outputs(
    out_dir: str | pathlib.Path,
    *,
    table: str,
    title: str,
    start: float,
    bullets: bool = True,
    **fields,
) -> dict:
    """:func:`write_results` (``fields``: its keywords; ``runtime_s``: the time since ``start``,
    a ``time.perf_counter()``) then :func:`write_table`, the notes as bullets under the table
    (unless ``bullets`` is False: the table shows them itself); the payload."""
    fields["runtime_s"] = time.perf_counter() - start
    notes = "".join(f"\n- {n}" for n in fields["notes"]) if bullets else ""
    table = table.rstrip("\n") + "\n" + notes + "\n" if notes else table
    payload = write_results(out_dir, **fields)
    write_table(out_dir, table, title=title)
    return payload


def write_table(
    out_dir: str | pathlib.Path, text: str, *, title: str | None = None
) -> pathlib.Path:
    """Write ``out_dir/table.md`` (an optional ``# title`` line, then ``text``); return its path."""
    path = prepare_out_dir(out_dir) / "table.md"
    body = (f"# {title}\n\n" if title else "") + text.rstrip() + "\n"
    path.write_text(body, encoding="utf-8")
    return path


def section(title: str, headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A ``## title`` section of table.md holding a Markdown table."""
    return f"## {title}\n\n" + markdown_table(headers, rows) + "\n"


def new_figure(
    nrows: int = 1,
    ncols: int = 1,
    *,
    figsize: tuple[float, float] | None = None,
    squeeze: bool = True,
):
    """A ``(fig, axes)`` pair on a headless Agg canvas (``axes`` as ``Figure.subplots``)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    if figsize is None:
        figsize = (4.5 * ncols, 3.6 * nrows)
    fig = Figure(figsize=figsize, layout="constrained")
    FigureCanvasAgg(fig)
    return fig, fig.subplots(nrows, ncols, squeeze=squeeze)


def save_figure(fig: Any, path: str | pathlib.Path) -> pathlib.Path:
    """Save ``fig`` as PNG at ``path`` (parents created) and return the path."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, format="png")
    return path


def load_blas_libraries() -> None:
    """Import SciPy's linear algebra so that threadpoolctl also limits SciPy's own OpenBLAS."""
    import scipy.linalg  # noqa: F401
