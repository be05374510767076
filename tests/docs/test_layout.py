"""The development page's layout is generated from the package's folders and docstrings, so a
move cannot leave it stale: every folder and top-level module has a docstring to show, and
the generated tree names each of them."""

from __future__ import annotations

import ast
from pathlib import Path

from docs.gen import hooks, layout

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "icegate_dagster"


def _folders() -> list[Path]:
    """Every folder of Python modules in the package, found independently of the generator."""
    return sorted(
        {p.parent for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts} - {PACKAGE}
    )


def _first_line(path: Path) -> str:
    docstring = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    return docstring.strip().splitlines()[0].strip() if docstring.strip() else ""


def test_every_package_folder_says_what_it_holds() -> None:
    assert _folders(), "no folders found: the walk is wrong"
    missing = [
        str(folder.relative_to(ROOT))
        for folder in [PACKAGE, *_folders()]
        if not (folder / "__init__.py").exists() or not _first_line(folder / "__init__.py")
    ]
    assert not missing, f"folders without an __init__.py docstring: {missing}"


def test_every_top_level_module_has_a_docstring() -> None:
    modules = sorted(PACKAGE.glob("*.py"))
    assert any(m.name == "definitions.py" for m in modules)
    missing = [m.name for m in modules if not _first_line(m)]
    assert not missing, f"top-level modules without a docstring: {missing}"


def test_the_generated_layout_names_every_folder_and_module() -> None:
    page = layout.markdown()
    lines = layout.tree()
    assert lines[0].startswith("icegate_dagster/ ")
    for folder in _folders():
        depth = len(folder.relative_to(PACKAGE).parts)
        entry = "  " * depth + folder.name + "/"
        (line,) = [line for line in lines if line.startswith(entry + " ")]
        assert _first_line(folder / "__init__.py").split()[0].replace("``", "") in line
        for module in folder.glob("*.py"):
            if module.name != "__init__.py":
                assert f" {module.name}" in page, module
    for module in PACKAGE.glob("*.py"):
        if module.name != "__init__.py":
            (line,) = [line for line in lines if line.startswith(f"  {module.name} ")]
            assert _first_line(module).split()[0].replace("``", "") in line


def test_the_development_page_shows_the_generated_layout() -> None:
    page = (ROOT / "docs" / "development.md").read_text(encoding="utf-8")
    assert "<!-- generated: layout -->" in page
    assert hooks.expand("<!-- generated: layout -->") == layout.markdown()
