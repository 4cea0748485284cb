"""The deep-net experiment (Table 3 / Fig. 3 at CPU scale): entry point for ``condreg reproduce
deepnet``.

It needs PyTorch, so — like every framework-specific piece of condreg — it is implemented in the
PyTorch adapter package, :mod:`condreg.torch.deepnet`; this module only exposes its ``run`` under
the common experiment contract (see :mod:`condreg.experiments`). Importing it imports torch.
"""

from __future__ import annotations

from condreg.torch.deepnet import DEFAULTS, run

__all__ = ["DEFAULTS", "run"]
