"""Every ``Examples`` section of condreg's docstrings runs as written (the API pages show them).

One test per module, so ``pytest -n`` spreads them. An example that imports an optional
library that is not installed here is skipped; everything else must pass.
"""

from __future__ import annotations

import doctest
import importlib
import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_IMPORTS = re.compile(r">>> (?:import ([\w., ]+)|from (\w+))")


def _modules() -> list[str]:
    out = []
    for path in sorted((ROOT / "condreg").rglob("*.py")):
        if ">>>" in path.read_text(encoding="utf-8"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            out.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return out


def _needs(docstring: str) -> set[str]:
    """Top-level modules an example imports."""
    names = set()
    for many, one in _IMPORTS.findall(docstring):
        names |= {p.strip().split(" ")[0].split(".")[0] for p in many.split(",") if p.strip()}
        names |= {one} if one else set()
    return names


def test_the_collector_finds_the_public_functions():
    assert {"condreg._api", "condreg.metrics", "condreg.torch"} <= set(_modules())
    assert _needs(">>> import numpy as np, condreg.torch\n>>> from jax import numpy") == {
        "numpy",
        "condreg",
        "jax",
    }


@pytest.mark.parametrize("name", _modules())
def test_examples_run(name):
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError as exc:
        pytest.skip(f"{name} needs {exc.name}")
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    ran = 0
    for test in doctest.DocTestFinder(exclude_empty=True).find(module, name):
        if test.examples and all(importlib.util.find_spec(m) for m in _needs(test.docstring)):
            runner.run(test)
            ran += 1
    result = runner.summarize(verbose=False)
    assert result.failed == 0, f"{result.failed} docstring example(s) of {name} failed (above)"
    if ran == 0:
        pytest.skip(f"every example of {name} needs a library that is not installed")
