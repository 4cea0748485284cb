"""Every ```python block of README.md and docs/ runs as written.

Each block runs in a fresh Python process (its own namespace, nothing shared between blocks), in
a temporary working directory, with a timeout. The one opt-out is explicit, on the block's first
line, with the reason after a dash::

    # requires: cuda, torchvision — a ResNet-50 on a GPU

skips the block only when one of the names is absent here: ``cuda`` means a CUDA GPU visible to
PyTorch; anything else is an importable module name (``transformers``, ``lightning`` …). A block
without that line always runs.

A block whose prose claims an effect prints the quantities as ``name=value`` and is followed
(blank lines allowed) by a comment the test asserts, one Python expression per ``;``::

    <!-- claims: rir > 1; ii <= 1; kappa_hp < kappa_kp -->

The names are the ``name=value`` pairs the block printed (the last value of a name counts; on a
line that starts with ``label:`` a pair is also ``label.name``; ``None`` reads as ``inf``), with
``stdout`` (the whole output) and ``near(a, b, rel=0.05)``.
"""

from __future__ import annotations

import importlib.util
import math
import os
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT = 300  # seconds per block
_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>[^\n`]*)$")


def _blocks(path: Path) -> list[tuple[int, str]]:
    """``(line, code)`` of every fenced block whose info string starts with ``python``."""
    return [(line, code) for line, code, _ in _blocks_and_claims(path)]


_CLAIMS = re.compile(r"^<!--\s*claims:(?P<claims>.*?)-->\s*$")


def _claims_after(lines: list[str], j: int) -> list[str]:
    """The claims of the ``<!-- claims: ... -->`` lines after line ``j`` (blank lines between)."""
    out = []
    j += 1
    while j < len(lines) and (not lines[j].strip() or _CLAIMS.match(lines[j])):
        if m := _CLAIMS.match(lines[j]):
            out += [c.strip() for c in m["claims"].split(";") if c.strip()]
        j += 1
    return out


def _blocks_and_claims(path: Path) -> list[tuple[int, str, list[str]]]:
    """``(line, code, claims)`` of every fenced ``python`` block."""
    out = []
    lines = path.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, info, indent = m["fence"], m["info"].strip(), len(m["indent"])
        start = i + 1
        j = start
        while j < len(lines):
            close = _FENCE.match(lines[j])
            if close and close["fence"].startswith(fence[0] * len(fence)) and not close["info"]:
                break
            j += 1
        if info.split()[:1] == ["python"] or info.startswith("python "):
            body = [ln[indent:] if ln[:indent].strip() == "" else ln for ln in lines[start:j]]
            out.append((start + 1, "\n".join(body) + "\n", _claims_after(lines, j)))
        i = j + 1
    return out


_PAIR = re.compile(
    r"(?<![\w.])(?P<name>[A-Za-z_]\w*)\s*=\s*"
    r"(?P<value>[-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?|inf|nan|None))(?![\w.])"
)
_LABEL = re.compile(r"^\s*(?P<label>[A-Za-z_]\w*)\s*:")


def _printed(stdout: str) -> dict[str, object]:
    """The ``name=value`` pairs of ``stdout`` as floats; ``label.name`` on ``label:`` lines."""
    values: dict[str, object] = {}
    labelled: dict[str, dict[str, float]] = {}
    for line in stdout.splitlines():
        label = _LABEL.match(line)
        for m in _PAIR.finditer(line):
            value = math.inf if m["value"] == "None" else float(m["value"])
            values[m["name"]] = value
            if label:
                labelled.setdefault(label["label"], {})[m["name"]] = value
    values.update({k: types.SimpleNamespace(**v) for k, v in labelled.items()})
    return values


def _near(a: float, b: float, rel: float = 0.05) -> bool:
    return abs(a - b) <= rel * abs(b)


def _failed_claims(claims: list[str], stdout: str) -> list[str]:
    """The claims that do not hold for ``stdout`` (an unknown name is a failed claim)."""
    scope = {
        "stdout": stdout,
        "near": _near,
        "abs": abs,
        "min": min,
        "max": max,
        **_printed(stdout),
    }
    bad = []
    for claim in claims:
        try:
            ok = bool(eval(claim, {"__builtins__": {}}, scope))  # noqa: S307 - our own docs
        except Exception as exc:  # noqa: BLE001 - reported as a failed claim
            ok, claim = False, f"{claim} ({type(exc).__name__}: {exc})"
        if not ok:
            bad.append(claim)
    return bad


def _documents() -> list[Path]:
    docs = sorted((ROOT / "docs").rglob("*.md")) if (ROOT / "docs").is_dir() else []
    return [ROOT / "README.md", *docs]


def _cases():
    for path in _documents():
        for line, code, claims in _blocks_and_claims(path):
            rel = path.relative_to(ROOT).as_posix()
            yield pytest.param(code, claims, id=f"{rel}:{line}")


_REQUIRES = re.compile(
    r"#\s*requires:\s*(?P<names>[\w.]+(?:\s*,\s*[\w.]+)*)\s*(?:(?:—|–|--?|:|;)\s*(?P<reason>.*))?$"
)


def _requirements(code: str) -> tuple[list[str], str]:
    """The names and the reason of a block's ``# requires:`` line (``([], "")`` without one)."""
    first = code.lstrip().splitlines()[0] if code.strip() else ""
    m = _REQUIRES.match(first.strip())
    if not m:
        return [], ""
    return [n.strip() for n in m["names"].split(",")], (m["reason"] or "").strip()


def _missing(code: str) -> list[str]:
    missing = []
    for req in _requirements(code)[0]:
        if req == "cuda":
            ok = importlib.util.find_spec("torch") is not None and _cuda()
        else:
            ok = importlib.util.find_spec(req) is not None
        if not ok:
            missing.append(req)
    return missing


def _cuda() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def test_the_collector_finds_blocks():
    sample = ROOT / "README.md"
    assert _blocks(sample), "README.md has python blocks"
    assert len(list(_cases())) >= 10


def test_the_collector_reads_fences_not_inline_code(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text(
        "| a | `x` |\n"
        "Inline ```` ```python ```` is no block.\n\n"
        "```python\nprint(1)\n```\n\n"
        '- item\n\n  ````python title="t"\n  x = 1\n  ```\n  y = 2\n  ````\n\n'
        "```pycon\n>>> 1\n```\n",
        encoding="utf-8",
    )
    assert _blocks(doc) == [(5, "print(1)\n"), (11, "x = 1\n```\ny = 2\n")]


def test_every_python_fence_is_collected():
    """A ```` ```python ```` that is not a fence (inline in a table, say) is a block that some
    Markdown readers run and that we would not: one spelling only."""
    for path in _documents():
        text = path.read_text(encoding="utf-8")
        fences = sum(1 for ln in text.splitlines() if re.match(r"\s*(`{3,}|~{3,})\s*python\b", ln))
        assert text.count("```python") + text.count("~~~python") == fences, path
        assert fences == len(_blocks(path)), path


def test_requires_line_names_and_reason():
    code = "# requires: cuda, torchvision — a ResNet-50 on a GPU\nimport torch\n"
    assert _requirements(code) == (["cuda", "torchvision"], "a ResNet-50 on a GPU")
    assert _requirements("# requires: optax\nx = 1\n") == (["optax"], "")
    assert _requirements("import os  # requires: nothing\n") == ([], "")
    assert _missing("# requires: os, no_such_module_xyz -- why\n") == ["no_such_module_xyz"]
    assert _missing("x = 1\n") == []


def test_claims_are_parsed_and_checked(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text(
        "```python\nprint('rir=2.5 ii=0.8')\n```\n\n<!-- claims: rir > 1; ii <= 1 -->\n\n"
        "Text.\n\n```python\nx = 1\n```\nText <!-- claims: x -->\n",
        encoding="utf-8",
    )
    assert [c for _, _, c in _blocks_and_claims(doc)] == [["rir > 1", "ii <= 1"], []]
    out = "RIR(i=2.0, ii=0.5, rir=4.0)\ngd: theta_I=10 immunized=None\nkappa = 1e+03\n"
    values = _printed(out)
    assert (values["rir"], values["kappa"], values["gd"].immunized) == (4.0, 1e3, math.inf)
    assert _failed_claims(["rir > 3", "gd.immunized > gd.theta_I", "near(kappa, 1010)"], out) == []
    failed = _failed_claims(["ii <= 0.1", "missing > 1", "'RIR(' in stdout"], out)
    assert (
        failed[0] == "ii <= 0.1"
        and failed[1].startswith("missing > 1 (NameError")
        and (len(failed) == 2)
    )


def test_every_claims_comment_follows_a_block():
    """A ``<!-- claims -->`` comment away from a block would silently check nothing."""
    for path in _documents():
        text = path.read_text(encoding="utf-8")
        comments = sum(1 for ln in text.splitlines() if _CLAIMS.match(ln))
        attached = sum(1 for _, _, c in _blocks_and_claims(path) if c)
        assert comments == attached, path


@pytest.mark.parametrize("code, claims", list(_cases()))
def test_block_runs(code, claims, tmp_path):
    missing = _missing(code)
    if missing:
        reason = _requirements(code)[1]
        pytest.skip(f"requires {', '.join(missing)}" + (f" ({reason})" if reason else ""))
    script = tmp_path / "block.py"
    script.write_text(code, encoding="utf-8")
    env = dict(os.environ)
    env.setdefault("OPENBLAS_NUM_THREADS", "1")
    env.setdefault("MPLBACKEND", "Agg")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    try:
        proc = subprocess.run(
            [sys.executable, str(script)],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"the block ran longer than {TIMEOUT} s")
    if proc.returncode != 0:
        pytest.fail(f"the block failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    failed = _failed_claims(claims, proc.stdout)
    assert not failed, (
        f"claims that do not hold: {failed}\nthe block printed:\n{proc.stdout[-3000:]}"
    )


def test_site_hook_turns_sphinx_roles_into_code_and_links():
    spec = importlib.util.spec_from_file_location("mkdocs_hooks", ROOT / "mkdocs_hooks.py")
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    html = "see :func:<code>condreg.r_ill</code> and :class:<code>~Local</code>."
    out = hooks.on_page_content(html, page=None, config=None, files=None)
    assert out == (
        'see <autoref identifier="condreg.r_ill" optional><code>condreg.r_ill</code></autoref>'
        " and <code>Local</code>."
    )


def test_site_builds_strict(tmp_path):
    """``mkdocs build --strict`` (also run by CI): API pages resolve, nav pages exist."""
    pytest.importorskip("mkdocs")
    pytest.importorskip("mkdocstrings")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert (tmp_path / "reference" / "condreg" / "index.html").is_file()


def _readme_commands() -> list[str]:
    """The command lines of README.md's first ```bash block (comments dropped)."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    block = re.search(r"^```bash\n(.*?)^```", text, re.S | re.M)
    assert block, "README.md starts with a bash block of commands"
    return [ln for ln in block[1].splitlines() if ln.strip() and not ln.startswith("#")]


def test_readme_commands_are_the_ci_commands():
    """Command 2 of the README installs what CI installs and runs CI's test command; the
    package itself asks only a loose lower bound of torch."""
    demo, tests = _readme_commands()
    assert "condreg reproduce mnist-pairs --quick" in demo
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    extras = re.compile(r'pip install (?:--quiet )?-e "\.\[([^\]]+)\]"')
    assert extras.findall(tests) == extras.findall(ci) != []
    # the studies are their own distribution, installed beside the library in both (and in
    # command 1, the demo: still one line)
    assert "-e ./experiments" in tests and "-e ./experiments" in ci and "-e ./experiments" in demo
    assert "pip install torch==2.13.0" in tests and '"torch==2.13.0"' in ci
    ci_lines = [ln for ln in ci.splitlines() if ln.strip() and not ln.startswith("#")]
    assert tests.split("&&")[-1].strip() == ci_lines[-1].strip()
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    torch_reqs = re.findall(r'"torch([^"]*)"', pyproject)
    assert torch_reqs and all(r.startswith(">=") for r in torch_reqs), torch_reqs


def test_distribution_name_is_condreg_ml():
    """The index's ``condreg`` is an unrelated project: the distribution is ``condreg-ml``."""
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert project["name"] == "condreg-ml"
    assert project["optional-dependencies"]["all"] == [
        "condreg-ml[torch,jax,optax,lightning,hf,finetune]"
    ]
    assert project["scripts"] == {"condreg": "condreg.cli:main"}


def _griffe_object(identifier: str, **options):
    """The griffe object of ``identifier`` on an API page: the library's (``condreg…``) or the
    studies' (``condreg_experiments…``, experiments/)."""
    griffe = pytest.importorskip("griffe")
    top, _, rest = identifier.partition(".")
    paths = [str(ROOT), str(ROOT / "experiments")]
    pkg = griffe.load(top, search_paths=paths, resolve_aliases=True, **options)
    return pkg[rest] if rest else pkg


def _reference_objects():
    """``(identifier, members or None)`` of every ``::: identifier`` on the API reference pages."""
    out = []
    for page in sorted((ROOT / "docs" / "reference").glob("*.md")):
        lines = page.read_text(encoding="utf-8").splitlines()
        for i, line in enumerate(lines):
            m = re.match(r":::\s*(\S+)", line)
            if not m:
                continue
            members, j = None, i + 1
            while j < len(lines) and (not lines[j].strip() or lines[j].startswith(" ")):
                if lines[j].strip() == "members:":
                    members = []
                elif members is not None and lines[j].strip().startswith("- "):
                    members.append(lines[j].strip()[2:].strip())
                j += 1
            out.append((m[1], members))
    return out


def _undocumented_parameters() -> tuple[dict[str, list[str]], list[str]]:
    """The public functions, methods and constructors the API pages render: those whose numpydoc
    ``Parameters`` section leaves out parameters of the signature (with them), and those that
    have parameters but no such section."""

    def documented(obj) -> set[str]:
        if obj.docstring is None:
            return set()
        sections = obj.docstring.parse("numpy", warnings=False)
        kinds = ("parameters", "other parameters")
        return {p.name.lstrip("*") for s in sections if s.kind.value in kinds for p in s.value}

    def check(path: str, func, doc_obj, gaps: dict) -> None:
        names = [p.name.lstrip("*") for p in func.parameters if p.name not in ("self", "cls")]
        listed = documented(doc_obj)
        if names and not listed:
            without.append(path)
        elif missing := [n for n in names if n not in listed]:
            gaps[path] = missing

    def visit(path: str, obj, gaps: dict, members=None) -> None:
        obj = obj.final_target if obj.is_alias else obj
        if obj.is_function:
            check(path, obj, obj, gaps)
        elif obj.is_class:
            init = obj.members.get("__init__")
            if init is not None and init.is_function and "dataclass" not in obj.labels:
                check(path, init, obj, gaps)  # merge_init_into_class: the class documents it
            for name, member in obj.members.items():
                # a method renders (and so must list its parameters) when it has a docstring
                if not name.startswith("_") and not member.is_alias and member.is_function:
                    if "property" not in member.labels and member.docstring is not None:
                        check(f"{path}.{name}", member, member, gaps)
        elif obj.is_module:
            for name, member in obj.members.items():
                if (members is None or name in members) and member.is_public:
                    target = member.final_target if member.is_alias else member
                    if not target.is_module:
                        visit(f"{path}.{name}", member, gaps)

    gaps: dict[str, list[str]] = {}
    without: list[str] = []
    for identifier, members in _reference_objects():
        obj = _griffe_object(
            identifier, docstring_parser="numpy", docstring_options={"warnings": False}
        )
        visit(identifier, obj, gaps, members)
    return gaps, sorted(without)


def _misrendered_defaults() -> list[str]:
    """Parameters whose default in the rendered table differs from the signature's. A numpydoc
    entry naming several parameters (``a, b : float``) gives all of them the first one's default,
    and ``{"x", "y"}`` as a type makes ``"x"`` the default; both show users a wrong value. A
    signature default ``None`` documented as its effective value (``default 0.005``) is fine."""

    def norm(value) -> str | None:
        return None if value is None else str(value).replace('"', "'")

    bad, seen = [], set()

    def check(path: str, func, doc_obj) -> None:
        signature = {p.name.lstrip("*"): p for p in func.parameters}
        for section in (
            doc_obj.docstring.parse("numpy", warnings=False) if doc_obj.docstring else ()
        ):
            if section.kind.value not in ("parameters", "other parameters"):
                continue
            for entry in section.value:
                param = signature.get(entry.name.lstrip("*"))
                if param is None or param.kind.value.startswith("variadic"):
                    continue
                shown, real = norm(entry.value), norm(param.default)
                if shown != real and real != "None":
                    bad.append(f"{path}: {entry.name} shows {shown}, signature {real}")

    def visit(path: str, obj) -> None:
        obj = obj.final_target if obj.is_alias else obj
        if id(obj) in seen or not path.split(".")[-1][:1].isalpha():
            return
        seen.add(id(obj))
        if obj.is_function:
            check(path, obj, obj)
        elif obj.is_class:
            init = obj.members.get("__init__")
            if init is not None and init.is_function:
                check(path, init, obj)
            for name, member in obj.members.items():
                if not name.startswith("_") and not member.is_alias and member.is_function:
                    check(f"{path}.{name}", member, member)
        elif obj.is_module:
            for name, member in obj.members.items():
                if member.is_alias and not str(member.target_path).startswith("condreg"):
                    continue
                visit(f"{path}.{name}", member)

    options = dict(docstring_parser="numpy", docstring_options={"warnings": False})
    for identifier, _ in _reference_objects():
        visit(identifier, _griffe_object(identifier, **options))
    return bad


def test_api_reference_defaults_are_the_signatures():
    bad = _misrendered_defaults()
    assert not bad, "\n".join(bad)


def test_api_reference_parameter_tables_are_complete():
    """The API pages render a numpydoc ``Parameters`` table (mkdocs.yml): where a public
    function, method or constructor has one, it lists every parameter of the signature."""
    gaps, _ = _undocumented_parameters()
    assert not gaps, "\n".join(f"{k}: {', '.join(v)}" for k, v in sorted(gaps.items()))


def test_readme_links_exist():
    """Every relative link of README.md names a file or folder of the repository."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    local = [t for t in targets if "://" not in t]
    assert len(local) >= 10
    missing = [t for t in local if not (ROOT / t).exists()]
    assert not missing, missing


_OLD_NAME = re.compile(r"(?<![\w.-])condreg\[|pip install\s+['\"]?condreg(?![\w-])")


def test_install_hints_name_the_distribution():
    """Every install hint — docs, docstrings, error messages — says ``condreg-ml``."""
    files = [*_documents(), *sorted((ROOT / "condreg").rglob("*.py"))]
    bad = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for path in files
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if _OLD_NAME.search(line)
    ]
    assert not bad, "\n".join(bad)
