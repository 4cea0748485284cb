"""What the release holds: ``python .ci/check_dist.py DIST`` checks the two sdists and the two
wheels that ``python -m build --outdir DIST .`` and ``python -m build --outdir DIST experiments``
made from this checkout (run by .ci/run, and by a maintainer before a release, CONTRIBUTING.md):
the library condreg-ml (no study code, no study data) and the studies condreg-experiments (their
data, the entry points ``condreg reproduce`` finds them by, the same version). Exits 1 with one
line per problem."""

from __future__ import annotations

import email.parser
import re
import sys
import tarfile
import zipfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
STUDIES = ROOT / "experiments"

#: Files the library's wheel must hold besides every module of the package: the PEP 561 marker.
WHEEL_DATA = ["condreg/py.typed"]
#: Files the studies' wheel must hold besides every module: the data the studies read and its
#: provenance (the house-price loader's docs point to it).
STUDY_DATA = [
    f"condreg_experiments/datasets/house_price/{name}"
    for name in ("README.md", "train.csv", "test.csv", "D1.csv", "D2.csv")
]
#: The studies ``condreg reproduce`` finds through the entry-point group condreg.studies.
STUDY_NAMES = ["house-prices", "mnist-pairs", "convergence", "deepnet", "attacks", "ablation"]
STUDY_NAMES += ["tamper"]
#: Files the library's sdist must hold besides the package: what its users read and run (the
#: CLI, the docstrings and the error messages point to docs/; the tests; how to cite).
SDIST_FILES = [
    "pyproject.toml",
    "README.md",
    "LICENSE",
    "CITATION.cff",
    "CHANGELOG.md",
    "CONTRIBUTING.md",
    "mkdocs.yml",
    "docs/index.md",
    "docs/reproduction.md",
    "docs/math.md",
    "tests/conftest.py",
    "benchmarks/README.md",
]


def _version() -> str:
    text = (ROOT / "condreg" / "__init__.py").read_text(encoding="utf-8")
    match = re.search(r'^__version__ = "([^"]+)"$', text, re.M)
    if match is None:
        raise SystemExit("condreg/__init__.py has no __version__ line")
    return match[1]


def _wheel(path: Path, dist: str, version: str) -> tuple[set[str], Any, str, list[str]]:
    """The wheel's names, METADATA, entry_points.txt and problems with its name and version."""
    info = f"{dist.replace('-', '_')}-{version}.dist-info"
    with zipfile.ZipFile(path) as whl:
        names = set(whl.namelist())
        meta = email.parser.Parser().parsestr(whl.read(f"{info}/METADATA").decode("utf-8"))
        entries = whl.read(f"{info}/entry_points.txt").decode("utf-8")
    problems = []
    if (meta["Name"], meta["Version"]) != (dist, version):
        problems.append(f"wheel is {meta['Name']} {meta['Version']}, expected {dist} {version}")
    return names, meta, entries, problems


def _sdist(path: Path, dist: str, version: str) -> set[str]:
    with tarfile.open(path) as sdist:
        top = f"{dist.replace('-', '_')}-{version}/"
        return {m.name.removeprefix(top) for m in sdist.getmembers()}


def _one(dist: Path, pattern: str) -> Path | None:
    found = sorted(dist.glob(pattern))
    return found[0] if len(found) == 1 else None


def check(dist: Path) -> list[str]:
    """The problems of the two wheels and the two sdists in ``dist`` (empty: all good)."""
    version, problems = _version(), []
    files = {
        k: _one(dist, p)
        for k, p in {
            "lib_whl": "condreg_ml-*.whl",
            "lib_sdist": "condreg_ml-*.tar.gz",
            "exp_whl": "condreg_experiments-*.whl",
            "exp_sdist": "condreg_experiments-*.tar.gz",
        }.items()
    }
    if None in files.values():
        return [f"expected one wheel and one sdist of each distribution in {dist}, got {files}"]
    # the library: every module, no study code, no study data
    modules = [p.relative_to(ROOT).as_posix() for p in (ROOT / "condreg").rglob("*.py")]
    names, meta, scripts, found = _wheel(files["lib_whl"], "condreg-ml", version)
    problems += found + [f"wheel lacks {n}" for n in [*WHEEL_DATA, *modules] if n not in names]
    if "condreg = condreg.cli:main" not in scripts:
        problems.append("wheel has no `condreg` console script")
    info = f"condreg_ml-{version}.dist-info/"
    stray = sorted(n for n in names if not n.startswith(("condreg/", info)))
    problems += [f"library wheel holds a file outside the package: {n}" for n in stray]
    study = sorted(n for n in names if "experiments" in n or "datasets" in n or n.endswith(".csv"))
    problems += [f"library wheel holds study code or data: {n}" for n in study]
    held = _sdist(files["lib_sdist"], "condreg-ml", version)
    problems += [f"sdist lacks {n}" for n in [*SDIST_FILES, *WHEEL_DATA, *modules] if n not in held]
    problems += [f"library sdist holds {n}" for n in sorted(held) if n.startswith("experiments/")]
    # the studies: every module, the data, the entry points, the library pinned at this version
    exp_modules = [p.relative_to(STUDIES).as_posix() for p in STUDIES.rglob("*.py")]
    names, meta, entries, found = _wheel(files["exp_whl"], "condreg-experiments", version)
    problems += found + [
        f"studies' wheel lacks {n}" for n in [*STUDY_DATA, *exp_modules] if n not in names
    ]
    info = f"condreg_experiments-{version}.dist-info/"
    stray = sorted(n for n in names if not n.startswith(("condreg_experiments/", info)))
    problems += [f"studies' wheel holds a file outside its package: {n}" for n in stray]
    group = entries.split("[condreg.studies]", 1)[-1].split("\n[", 1)[0]
    declared = re.findall(r"^([\w-]+) = condreg_experiments\.", group, re.M)
    if sorted(declared) != sorted(STUDY_NAMES):
        problems.append(f"studies' wheel declares the studies {declared}, not {STUDY_NAMES}")
    if f"condreg-ml=={version}" not in (meta.get_all("Requires-Dist") or []):
        problems.append(f"studies' wheel does not require condreg-ml=={version}")
    held = _sdist(files["exp_sdist"], "condreg-experiments", version)
    wanted = ["pyproject.toml", "README.md", *STUDY_DATA, *exp_modules]
    problems += [f"studies' sdist lacks {n}" for n in wanted if n not in held]
    return problems


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python .ci/check_dist.py DIST", file=sys.stderr)
        return 2
    problems = check(Path(argv[0]))
    for line in problems:
        print(f"check_dist: {line}", file=sys.stderr)
    if not problems:
        print(f"check_dist: the wheels and the sdists in {argv[0]} hold what they should")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
