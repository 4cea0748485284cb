"""What a release ships and says: one version (``condreg.__version__``, the distribution's metadata,
``condreg --version``, CITATION.cff, CHANGELOG.md), a CITATION.cff valid against the Citation
File Format schema, py.typed, and install hints that name no command that fails today."""

from __future__ import annotations

import importlib.metadata
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import condreg
from condreg import cli

ROOT = Path(__file__).resolve().parents[1]


def test_the_version_has_one_home():
    """pyproject.toml reads ``__version__`` (no second copy to forget)."""
    tomllib = pytest.importorskip("tomllib")
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert "version" not in pyproject["project"]
    assert pyproject["project"]["dynamic"] == ["version"]
    dynamic = pyproject["tool"]["setuptools"]["dynamic"]["version"]
    assert dynamic == {"attr": "condreg.__version__"}
    assert re.fullmatch(r"\d+\.\d+\.\d+", condreg.__version__)


def test_the_studies_have_the_library_version():
    """experiments/pyproject.toml (the studies' distribution) names the library's version, and
    pins the library at it, everywhere it names it (the release bumps them with __version__)."""
    tomllib = pytest.importorskip("tomllib")
    text = (ROOT / "experiments" / "pyproject.toml").read_text(encoding="utf-8")
    project = tomllib.loads(text)["project"]
    assert project["name"] == "condreg-experiments"
    assert project["version"] == condreg.__version__
    pins = re.findall(r'"condreg-ml(?:\[\w+\])?==([^"]+)"', text)
    assert pins and set(pins) == {condreg.__version__}, pins
    assert len(pins) == text.count('"condreg-ml')  # no other spelling of the requirement
    try:
        installed = importlib.metadata.version("condreg-experiments")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("condreg-experiments is not installed (pip install -e ./experiments)")
    assert installed == condreg.__version__


def test_the_installed_metadata_is_that_version():
    try:
        installed = importlib.metadata.version("condreg-ml")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("condreg-ml is not installed (running from a bare checkout)")
    assert installed == condreg.__version__


def test_condreg_version_prints_it(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"condreg {condreg.__version__}"


def test_citation_and_changelog_name_the_version():
    cff = (ROOT / "CITATION.cff").read_text(encoding="utf-8")
    assert re.search(rf"^version: {re.escape(condreg.__version__)}$", cff, re.M)
    assert "arXiv:2505.23760" in cff and "Model Immunization from a Condition Number" in cff
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    headings = re.findall(r"^## \[([^\]]+)\]", changelog, re.M)
    assert headings[0] == "Unreleased" and headings[1] == condreg.__version__, headings


def _cffconvert() -> str:
    """The ``cffconvert`` of this environment (the ``release`` extra), else skip."""
    beside = Path(sys.executable).with_name("cffconvert")
    exe = str(beside) if beside.exists() else shutil.which("cffconvert")
    if exe is None:
        pytest.skip("cffconvert is not installed (pip install -e '.[release]')")
    return exe


def test_citation_cff_is_valid():
    """``cffconvert --validate`` (the ``release`` extra; it ships the schema: no network)."""
    exe = _cffconvert()
    ok = subprocess.run(
        [exe, "--validate", "-i", str(ROOT / "CITATION.cff")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ok.returncode == 0, ok.stdout + ok.stderr


def test_cffconvert_can_fail(tmp_path):
    """The validation above is a real check: a file against the schema is rejected."""
    exe = _cffconvert()
    bad = tmp_path / "CITATION.cff"
    bad.write_text(
        (ROOT / "CITATION.cff").read_text(encoding="utf-8").replace("cff-version: 1.2.0", "x: 1"),
        encoding="utf-8",
    )
    done = subprocess.run([exe, "--validate", "-i", str(bad)], capture_output=True, timeout=120)
    assert done.returncode != 0


def test_py_typed_ships():
    assert (Path(condreg.__file__).parent / "py.typed").is_file()


def _plain(text: str) -> str:
    """Markdown as one line of words (no line breaks, no bold)."""
    return " ".join(text.replace("**", "").split())


_INSTALL = re.compile(r"pip install[^`\n]*condreg-ml")


def test_install_hints_say_the_index_name_is_not_yet_published():
    """``condreg-ml`` is not on the package index yet: every document that names an install from
    it says so in the same paragraph, and the README and the docs' front page show the commands
    that work today (a clone, a built wheel)."""
    files = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), ROOT / "CONTRIBUTING.md"]
    for path in files:
        for paragraph in re.split(r"\n\s*\n", path.read_text(encoding="utf-8")):
            if _INSTALL.search(paragraph):
                assert "not yet published" in _plain(paragraph), (path.name, paragraph)
    for path in (ROOT / "README.md", ROOT / "docs" / "index.md"):
        text = _plain(path.read_text(encoding="utf-8"))
        assert 'pip install -e "' in text and "python -m build" in text, path.name
        assert "not yet published" in text and ">= 2.3" in text, path.name
