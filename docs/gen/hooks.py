"""The MkDocs hook (``hooks:`` in mkdocs.yml) that writes the generated references into
their pages at build time.

A page asks for a reference with a line of its own, ``<!-- generated: NAME -->`` (or
``<!-- generated: NAME ARGUMENT -->`` for a generator that takes one, such as
``config-block maintain.health``); the line is replaced by what :data:`GENERATORS`
renders from the code. An unknown name fails the build.
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

from docs.gen import cli_reference, config_reference, dagster_reference, layout  # noqa: E402

GENERATORS: dict[str, Callable[..., str]] = {
    "config-reference": config_reference.markdown,
    "config-block": config_reference.block_markdown,
    "cli-reference": cli_reference.markdown,
    "dagster-reference": dagster_reference.markdown,
    "layout": layout.markdown,
}
PLACEHOLDER = re.compile(r"^<!-- generated: ([a-z-]+)(?: (\S+))? -->$", re.MULTILINE)


@cache
def generated(name: str, argument: str | None = None) -> str:
    """The Markdown of one reference (rendered once per build process)."""
    if name not in GENERATORS:
        raise ValueError(f"no generated reference {name!r} (known: {', '.join(GENERATORS)})")
    return GENERATORS[name](argument) if argument is not None else GENERATORS[name]()


def expand(markdown: str) -> str:
    """``markdown`` with every placeholder replaced by its reference."""
    return PLACEHOLDER.sub(lambda match: generated(match.group(1), match.group(2)), markdown)


def on_page_markdown(markdown: str, **_: Any) -> str:
    """MkDocs event: a page's Markdown, before it is rendered."""
    return expand(markdown)
