"""A griffe extension for the API reference (docs/api.md, mkdocs.yml): the package's
docstrings use Sphinx conventions that mkdocstrings does not render.

* ``:class:`X```, ``:func:`~a.b```, ``:mod:`...``` … roles become Markdown code spans;
* ``#:`` comments right above a class or module attribute become its docstring.
"""

from __future__ import annotations

import ast
import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:class|func|meth|mod|attr|data|exc|obj):`~?([^`]+)`")


def _plain(text: str) -> str:
    return ROLE.sub(r"`\1`", text)


class SphinxConventions(griffe.Extension):
    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = _plain(obj.docstring.value)

    def on_attribute_instance(
        self, *, node: ast.AST | griffe.ObjectNode, attr: griffe.Attribute, **kwargs: Any
    ) -> None:
        if attr.docstring is not None or attr.lineno is None:
            return
        try:
            lines = attr.lines_collection[attr.filepath]  # type: ignore[index]
        except (KeyError, TypeError, griffe.BuiltinModuleError):
            return
        comments: list[str] = []
        index = attr.lineno - 2  # the line above the attribute, 0-based
        while index >= 0 and lines[index].strip().startswith("#:"):
            comments.insert(0, lines[index].strip()[2:].strip())
            index -= 1
        if comments:
            attr.docstring = griffe.Docstring(
                _plain("\n".join(comments)), lineno=index + 2, parent=attr
            )
