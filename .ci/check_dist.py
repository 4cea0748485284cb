"""What the release holds: ``python .ci/check_dist.py DIST`` checks the sdist and the wheel that
``python -m build --outdir DIST`` made from this checkout (run by .ci/run, and by a maintainer
before a release, CONTRIBUTING.md). Exits 1 with one line per problem."""

from __future__ import annotations

import email.parser
import re
import sys
import tarfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: Files the wheel must hold besides every module of the package: the data the experiments
#: read, the PEP 561 marker, the data's provenance (the house-price loader's docs point to it).
WHEEL_DATA = [
    "condreg/py.typed",
    "experiments/condreg_experiments/datasets/house_price/README.md",
    "experiments/condreg_experiments/datasets/house_price/train.csv",
    "experiments/condreg_experiments/datasets/house_price/test.csv",
    "experiments/condreg_experiments/datasets/house_price/D1.csv",
    "experiments/condreg_experiments/datasets/house_price/D2.csv",
]
#: Files the sdist must hold besides the package: what its users read and run (the CLI, the
#: docstrings and the error messages point to docs/; the tests; how to cite).
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


def check(dist: Path) -> list[str]:
    """The problems of the one wheel and the one sdist in ``dist`` (empty: all good)."""
    version, problems = _version(), []
    wheels, sdists = sorted(dist.glob("*.whl")), sorted(dist.glob("*.tar.gz"))
    if len(wheels) != 1 or len(sdists) != 1:
        return [f"expected one wheel and one sdist in {dist}, got {wheels + sdists}"]
    modules = [p.relative_to(ROOT).as_posix() for p in (ROOT / "condreg").rglob("*.py")]
    with zipfile.ZipFile(wheels[0]) as whl:
        names = set(whl.namelist())
        info = f"condreg_ml-{version}.dist-info"
        meta = email.parser.Parser().parsestr(whl.read(f"{info}/METADATA").decode("utf-8"))
        scripts = whl.read(f"{info}/entry_points.txt").decode("utf-8")
    problems += [f"wheel lacks {n}" for n in [*WHEEL_DATA, *modules] if n not in names]
    if (meta["Name"], meta["Version"]) != ("condreg-ml", version):
        problems.append(f"wheel is {meta['Name']} {meta['Version']}, expected condreg-ml {version}")
    if "condreg = condreg.cli:main" not in scripts:
        problems.append("wheel has no `condreg` console script")
    stray = sorted(n for n in names if not n.startswith(("condreg/", f"{info}/")))
    problems += [f"wheel holds a file outside the package: {n}" for n in stray]
    with tarfile.open(sdists[0]) as sdist:
        top = f"condreg_ml-{version}/"
        held = {m.name.removeprefix(top) for m in sdist.getmembers()}
    wanted = [*SDIST_FILES, *WHEEL_DATA, *modules]
    problems += [f"sdist lacks {n}" for n in wanted if n not in held]
    return problems


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python .ci/check_dist.py DIST", file=sys.stderr)
        return 2
    problems = check(Path(argv[0]))
    for line in problems:
        print(f"check_dist: {line}", file=sys.stderr)
    if not problems:
        print(f"check_dist: the wheel and the sdist in {argv[0]} hold what they should")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
