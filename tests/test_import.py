"""``import condreg`` must not import a framework (the design rule in docs/math.md, "Design"):
checked in a fresh interpreter."""

from __future__ import annotations

import json
import subprocess
import sys

FRAMEWORKS = ("torch", "jax", "jaxlib", "tensorflow", "cupy")


def _modules_after(code: str) -> set[str]:
    script = code + "\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))\n"
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120
    )
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def test_import_condreg_imports_no_framework():
    modules = _modules_after("import condreg")
    loaded = sorted(m for m in modules if m.split(".")[0] in FRAMEWORKS)
    assert loaded == [], f"import condreg imported {loaded}"


def test_import_condreg_imports_no_study_dependency():
    """The studies are their own distribution (condreg-experiments): ``import condreg`` and the
    command's parser load none of their dependencies, nor the studies themselves."""
    study_deps = ("matplotlib", "mlxtend", "sklearn", "tqdm", "condreg_experiments")
    for code in ("import condreg", "import condreg, condreg.cli"):
        modules = _modules_after(code)
        loaded = sorted(m for m in modules if m.split(".")[0] in study_deps)
        assert loaded == [], f"{code} imported {loaded}"
    assert "condreg_experiments" in _modules_after("import condreg_experiments")  # the control


def test_numpy_calls_and_testing_import_no_framework():
    """Using the functions on NumPy arrays, and condreg.testing, load no framework either."""
    code = (
        "import numpy as np, condreg, condreg.testing as t\n"
        "S = t.matrix_with_spectrum([3.0, 2.0, 1.0], 4, 3, seed=0)\n"
        "condreg.r_ill(S); condreg.r_ill_grad(S); condreg.r_well_grad(S, gram=True)\n"
        "t.assert_close(condreg.condition_number(S), np.asarray(3.0), rtol=1e-12)\n"
    )
    modules = _modules_after(code)
    loaded = sorted(m for m in modules if m.split(".")[0] in FRAMEWORKS)
    assert loaded == [], f"{loaded} imported"


def test_the_check_can_fail():
    """Control: the same probe sees a module that is imported (without paying for a framework)."""
    modules = _modules_after("import condreg, fractions")
    assert "fractions" in modules and "condreg" in modules


def test_public_names():
    import condreg

    for name in (
        "condition_number",
        "r_well",
        "r_ill",
        "condition_number_grad",
        "r_well_grad",
        "r_ill_grad",
        "RankError",
        "PoleError",
        "TiedExtremeError",
    ):
        assert name in condreg.__all__ and hasattr(condreg, name)
    for err in (condreg.RankError, condreg.PoleError, condreg.TiedExtremeError):
        assert issubclass(err, ValueError)
