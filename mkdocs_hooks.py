"""mkdocs hooks for the documentation site (mkdocs.yml: ``hooks``).

condreg's docstrings use Sphinx roles (``:func:`condreg.r_ill```); mkdocstrings renders them as
``:func:<code>condreg.r_ill</code>``. This hook drops the role and, for a fully qualified
``condreg.`` or ``condreg_experiments.`` name, links it to its API entry (an optional
cross-reference: no warning when the object has no page of its own).
"""

from __future__ import annotations

import re

_ROLE = re.compile(r":(?:class|func|meth|mod|data|attr|exc|obj|py:\w+):<code>~?([^<]+)</code>")


def _replace(match: re.Match) -> str:
    name = match[1].strip()
    if name.split(".")[0] in ("condreg", "condreg_experiments"):
        return f'<autoref identifier="{name}" optional><code>{name}</code></autoref>'
    return f"<code>{name}</code>"


def on_page_content(html: str, **kwargs) -> str:
    return _ROLE.sub(_replace, html)
