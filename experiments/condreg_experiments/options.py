"""Every study's settings, resolved in one place (:class:`StudySettings`: defaults, ``--quick``'s
overrides, then the options given, checked before any work), and the command-line option types
and groups of the studies' ``add_arguments`` (each type raises
:class:`argparse.ArgumentTypeError`, which argparse reports as one line)."""

from __future__ import annotations

import argparse
import dataclasses
import math
import pathlib
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from condreg_experiments import UsageError
from condreg_experiments._report import check_positive

__all__ = ["StudySettings", "as_tuple", "parse_pairs", "positive_int", "positive_float"]
__all__ += ["fraction", "method_list", "add_linear_options", "add_resume_option", "check_pairs"]


def as_tuple(key: str, value: Any, kind: type, study: str) -> tuple:
    """A list option (``"a,b"`` or a sequence) as a tuple of ``kind``; a :class:`UsageError`
    naming ``study``'s option otherwise."""
    if isinstance(value, str):
        value = [v.strip() for v in value.split(",") if v.strip()]
    try:
        return tuple(kind(v) for v in value)
    except (TypeError, ValueError):
        msg = f"{study} option {key}={value!r}: expected a list of {kind.__name__}"
        raise UsageError(msg) from None


_KINDS = {"str": str, "int": int, "float": float}


@dataclasses.dataclass(frozen=True)
class StudySettings:
    """The base of every study's settings: a frozen dataclass of the study's knobs, built by
    :meth:`resolve` (the field defaults, then :attr:`QUICK` with ``--quick``, then the options
    given; ``None`` means "the default" except for the fields in :attr:`NONE_OK`), each list
    option made a tuple and each path a :class:`pathlib.Path`, then checked: the fields in
    :attr:`POSITIVE` must be positive numbers, and :meth:`checked` adds the study's own rules.
    Every problem is a :class:`UsageError`, before any work; :meth:`to_json` is what
    results.json records and ``--resume`` compares."""

    STUDY: ClassVar[str] = "study"
    QUICK: ClassVar[Mapping[str, Any]] = {}
    NONE_OK: ClassVar[tuple[str, ...]] = ()
    POSITIVE: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def resolve(cls, quick: bool, options: Mapping[str, Any]):
        """The checked settings of a run (``options``: field name -> value or None)."""
        fields = {f.name: str(f.type) for f in dataclasses.fields(cls)}
        unknown = sorted(set(options) - set(fields))
        if unknown:
            known = ", ".join(sorted(fields))
            raise UsageError(f"unknown {cls.STUDY} option(s): {', '.join(unknown)}; known: {known}")
        values = dict(cls.QUICK) if quick else {}
        values.update({k: v for k, v in options.items() if v is not None or k in cls.NONE_OK})
        for key, value in values.items():
            kind = fields[key]
            if value is not None and kind.startswith("tuple["):
                values[key] = as_tuple(key, value, _KINDS[kind[6:].split(",")[0]], cls.STUDY)
            elif value is not None and "Path" in kind:
                values[key] = pathlib.Path(value)
        for key in cls.POSITIVE:
            check_positive(
                f"--{key.replace('_', '-')}", values.get(key), integer=fields[key] == "int"
            )
            if key in values:
                values[key] = _KINDS[fields[key]](values[key])
        return cls(**values).checked()

    @classmethod
    def take(cls, options: dict[str, Any]) -> dict[str, Any]:
        """The entries of ``options`` named as fields of these settings (removed from it)."""
        return {f.name: options.pop(f.name) for f in dataclasses.fields(cls) if f.name in options}

    def checked(self):
        """These settings, checked by the study's own rules (and completed); UsageError."""
        return self

    def to_json(self) -> dict[str, Any]:
        """The settings by field, paths as strings (results.json writes the tuples as lists)."""
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return {k: str(v) if isinstance(v, pathlib.Path) else v for k, v in values.items()}


def check_pairs(pairs: Any, default: Any) -> list[tuple[int, int]]:
    """``pairs`` (None: ``default``) as distinct ordered (P, H) digit pairs 0-9, P ≠ H;
    :class:`UsageError` otherwise."""
    keys = [tuple(p) for p in (default if pairs is None else pairs)]
    bad = [p for p in keys if len(p) != 2 or p[0] == p[1] or not set(p) <= set(range(10))]
    if bad or not keys:
        raise UsageError(f"--pairs needs distinct (P, H) digits 0-9, got {bad or 'none'}")
    twice = sorted({f"{p}-{h}" for p, h in keys if keys.count((p, h)) > 1})
    if twice:
        raise UsageError(f"--pairs lists {', '.join(twice)} more than once")
    return keys


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
