"""The studies of *Model Immunization from a Condition Number Perspective* (ICML 2025) behind
``condreg reproduce`` (docs/reproduction.md), one module per study, each with ``HELP``,
``add_arguments(parser)`` and ``run(out_dir, *, quick, seeds, progress, **options)`` (writes
``results.json``, ``table.md`` and plots; returns the ``results.json`` payload). The library's
command finds them through the entry-point group ``condreg.studies`` (this distribution's
pyproject.toml); every study runs its units through :mod:`condreg_experiments._runner`."""

from __future__ import annotations

from condreg.cli import UsageError

__all__ = ["UsageError"]
