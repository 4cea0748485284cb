"""The data error of the experiments' loaders (re-exported by :mod:`condreg.experiments.data`)."""

from __future__ import annotations

__all__ = ["DataError"]


class DataError(ValueError):
    """A data file exists but is malformed (bad header, ragged rows, bad values)."""
