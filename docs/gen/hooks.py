"""The MkDocs hook (``hooks:`` in mkdocs.yml) that writes the generated references into
their pages at build time.

A page asks for a reference with a line of its own, ``<!-- generated: NAME -->``; the line
is replaced by what :data:`GENERATORS` renders from the code. An unknown name fails the
build.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

# MkDocs puts only this file's folder on sys.path while it loads the hook; the generators
# import ``docs.gen`` from the repository root.
_ROOT = str(Path(__file__).resolve().parents[2])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from docs.gen import cli_reference, config_reference, dagster_reference  # noqa: E402

GENERATORS: dict[str, Callable[[], str]] = {
    "config-reference": config_reference.markdown,
    "cli-reference": cli_reference.markdown,
    "dagster-reference": dagster_reference.markdown,
}
PLACEHOLDER = re.compile(r"^<!-- generated: ([a-z-]+) -->$", re.MULTILINE)


@cache
def generated(name: str) -> str:
    """The Markdown of one reference (rendered once per build process)."""
    if name not in GENERATORS:
        raise ValueError(f"no generated reference {name!r} (known: {', '.join(GENERATORS)})")
    return GENERATORS[name]()


def expand(markdown: str) -> str:
    """``markdown`` with every placeholder replaced by its reference."""
    return PLACEHOLDER.sub(lambda match: generated(match.group(1)), markdown)


def on_page_markdown(markdown: str, **_: Any) -> str:
    """MkDocs event: a page's Markdown, before it is rendered."""
    return expand(markdown)
