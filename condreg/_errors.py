"""Typed errors raised by condreg.

All of them subclass :class:`ValueError` so that ``except ValueError`` keeps working for callers
that do not care about the distinction.
"""

from __future__ import annotations

__all__ = ["RankError", "PoleError", "TiedExtremeError"]


class RankError(ValueError):
    """The matrix has too small a numerical rank for the requested quantity (e.g. rank 0)."""


class PoleError(ValueError):
    """R_ill is at its pole: all nonzero singular values are equal (kappa = 1, or rank 1).

    The value there is ``+inf`` (documented); the gradient is undefined and raises this error.
    """


class TiedExtremeError(ValueError):
    """The extreme singular value is tied and ``subgradient="raise"`` was requested."""
