"""A griffe extension for the API reference (``mkdocs.yml``: mkdocstrings ``extensions``).

sparsedp's docstrings use a few Sphinx roles (``:func:`solve```, ``:class:`~sparsedp.privacy.Accountant```),
reST's ``text::`` before a literal block, and doctest examples (``>>>``) outside any section.
Markdown shows roles verbatim and turns ``>>>`` lines into a quotation, so this extension rewrites
the rendered copy (the source files are not touched): ``:role:`a.b.C``` -> `` `a.b.C` ``,
``:role:`~a.b.C``` -> `` `C` ``, a line ending in ``::`` ends in ``:``, and each doctest block
(from a ``>>>`` line to the next blank line) becomes a fenced ``pycon`` code block.
"""

from __future__ import annotations

import re
from typing import Any

from griffe import Extension, Object

_ROLE = re.compile(r":(?:py:)?(?:func|class|meth|mod|attr|data|exc|obj|const|ref|term):`(~?)([^`<>]+?)(?:\s*<[^>]*>)?`")
_LITERAL = re.compile(r"(?<=\S)::[ \t]*$", re.MULTILINE)


def markdown_roles(text: str) -> str:
    """The docstring ``text`` with Sphinx roles as inline code and ``::`` line ends as ``:``."""

    def role(match: re.Match[str]) -> str:
        tilde, target = match.group(1), match.group(2).strip()
        return f"`{target.rsplit('.', 1)[-1] if tilde else target}`"

    return fence_doctests(_LITERAL.sub(":", _ROLE.sub(role, text)))


def fence_doctests(text: str) -> str:
    """Wrap every doctest block (a ``>>>`` line up to the next blank line) in a ``pycon`` fence."""
    out: list[str] = []
    lines = text.split("\n")
    i, fenced = 0, False
    while i < len(lines):
        line = lines[i]
        if line.lstrip().startswith("```"):
            fenced = not fenced
        if not fenced and line.lstrip().startswith(">>>"):
            indent = line[: len(line) - len(line.lstrip())]
            block = []
            while i < len(lines) and lines[i].strip():
                block.append(lines[i][len(indent):] if lines[i].startswith(indent) else lines[i].lstrip())
                i += 1
            out += [f"{indent}```pycon", *(indent + b for b in block), f"{indent}```"]
            continue
        out.append(line)
        i += 1
    return "\n".join(out)


class SphinxRoles(Extension):
    """Rewrite Sphinx roles in every docstring once the object tree is built."""

    def on_object(self, *, obj: Object, **kwargs: Any) -> None:
        if obj.docstring is not None and (":" in obj.docstring.value or ">>>" in obj.docstring.value):
            obj.docstring.value = markdown_roles(obj.docstring.value)

    def on_package(self, *, pkg: Object, **kwargs: Any) -> None:
        """The top-level package itself (``on_object`` does not see it)."""
        self.on_object(obj=pkg)
