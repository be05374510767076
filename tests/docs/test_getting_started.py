"""Every shell command of docs/getting-started.md runs in a test, or the page says why not.

Each shell block of the page is preceded by a marker, ``<!-- check: ... -->``:

* ``run``: this test runs the block's commands, in order, on the embedded default of a
  fresh folder (shared by the page's ``run`` blocks, as a reader's folder would be); each
  must exit 0, and a ``text`` block right after the commands holds lines the last one
  prints;
* a list of places, ``.ci/run`` or ``tests/x.py::test_name``: each command of the block is
  run there (a file that holds the command, or a test that calls ``run_cli`` with its
  arguments), so this test checks the page against them rather than run a slow command
  twice;
* ``not run: <why>``: never run, and the reason says why.

A block without a marker, an unknown place, or a command found in none of its places fails.
"""

from __future__ import annotations

import ast
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest

from icegate_dagster.cli.dispatch import run_cli

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "getting-started.md"
CLI = "icegate-maintain"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```\n", re.MULTILINE | re.DOTALL)
MARKER = re.compile(r"<!-- check: (.+) -->")
SHELL = {"bash", "sh", "shell", "console"}


@dataclass(frozen=True)
class Block:
    """One shell block of the page: its marker, its commands, the output shown after it."""

    check: str
    commands: list[list[str]]
    output: list[str]
    line: int


def commands(text: str) -> list[list[str]]:
    """The commands of a shell block: each line's ``&&``-separated parts, comments dropped."""
    found: list[list[str]] = []
    for line in text.splitlines():
        command: list[str] = []
        for token in shlex.split(line, comments=True):
            if token == "&&":
                found.append(command)
                command = []
            else:
                command.append(token)
        if command:
            found.append(command)
    return found


def shell_blocks(page: str) -> list[Block]:
    """Every shell block of ``page`` with its marker (``""`` when it has none)."""
    fences = list(FENCE.finditer(page))
    blocks = []
    for index, fence in enumerate(fences):
        if fence.group(1) not in SHELL:
            continue
        # The marker is the last line before the block.
        marker = MARKER.fullmatch(page[: fence.start()].rstrip().rpartition("\n")[2])
        after = fences[index + 1] if index + 1 < len(fences) else None
        shown = (
            after is not None
            and after.group(1) == "text"
            and not page[fence.end() : after.start()].strip()
        )
        blocks.append(
            Block(
                check=marker.group(1).strip() if marker else "",
                commands=commands(fence.group(2)),
                output=after.group(2).splitlines() if shown and after else [],
                line=page.count("\n", 0, fence.start()) + 1,
            )
        )
    return blocks


def cli_arguments(command: list[str]) -> list[str] | None:
    """The arguments of an ``icegate-maintain`` command, or None for another program."""
    return command[1:] if Path(command[0]).name == CLI else None


def _run_cli_calls(tree: ast.AST) -> list[list[str]]:
    """The literal argument lists of every ``run_cli([...])`` call under ``tree``."""
    calls = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and getattr(node.func, "id", None) == "run_cli"
            and node.args
            and isinstance(node.args[0], ast.List)
            and all(isinstance(item, ast.Constant) for item in node.args[0].elts)
        ):
            calls.append([str(item.value) for item in node.args[0].elts])
    return calls


def runs_there(command: list[str], place: str) -> bool:
    """``command`` is run at ``place``: a file holding its text, or a test function calling
    ``run_cli`` with its arguments (or holding its text)."""
    path, _, function = place.partition("::")
    source = (REPO / path).read_text(encoding="utf-8")
    if function:
        node = next(
            (
                n
                for n in ast.walk(ast.parse(source))
                if isinstance(n, ast.FunctionDef) and n.name == function
            ),
            None,
        )
        assert node is not None, f"{place}: no such test"
        source = ast.get_source_segment(source, node) or ""
        arguments = cli_arguments(command)
        if arguments is not None and arguments in _run_cli_calls(node):
            return True
    return shlex.join(command) in source


def _marked() -> list[Block]:
    return shell_blocks(PAGE.read_text(encoding="utf-8"))


def test_every_shell_block_is_run_or_says_why_not() -> None:
    blocks = _marked()
    assert blocks, "the page shows no command"
    for block in blocks:
        assert block.check, f"line {block.line}: a shell block with no <!-- check: ... -->"
        assert block.commands, f"line {block.line}: a shell block with no command"
        if block.check.startswith("not run:"):
            assert block.check.removeprefix("not run:").strip(), f"line {block.line}: why?"
        elif block.check != "run":
            places = [place.strip() for place in block.check.split(",")]
            for place in places:
                assert (REPO / place.partition("::")[0]).is_file(), f"{place}: no such file"
            for command in block.commands:
                assert any(runs_there(command, place) for place in places), (
                    f"line {block.line}: {shlex.join(command)} is run in none of {places}"
                )


def test_the_pages_run_commands_succeed_on_the_embedded_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The blocks marked ``run``, in the page's order, in one fresh folder."""
    monkeypatch.chdir(tmp_path)
    for name in ("ICEGATE_CONFIG", "DAGSTER_HOME"):
        monkeypatch.delenv(name, raising=False)
    ran = 0
    for block in (b for b in _marked() if b.check == "run"):
        out = ""
        for command in block.commands:
            arguments = cli_arguments(command)
            assert arguments is not None, f"line {block.line}: only {CLI} commands can be run"
            code = run_cli(arguments)
            out = capsys.readouterr().out
            assert code == 0, f"{shlex.join(command)} exited {code}:\n{out}"
            ran += 1
        printed = {" ".join(line.split()) for line in out.splitlines()}
        missing = [line for line in block.output if " ".join(line.split()) not in printed]
        assert missing == [], f"line {block.line}: the page shows lines it did not print"
    assert ran, "no block of the page is marked run"


def test_a_command_is_found_only_where_it_runs() -> None:
    """The check itself: the demo test runs ``demo`` and not ``status``; .ci/run runs
    setup.sh and not the demo; a marker-less block is seen as such."""
    demo_test = "tests/integration/test_cli.py::test_demo_prints_before_and_after"
    assert runs_there([".venv/bin/icegate-maintain", "demo"], demo_test)
    assert not runs_there([".venv/bin/icegate-maintain", "status"], demo_test)
    assert runs_there(["./scripts/setup.sh"], ".ci/run")
    assert not runs_there([".venv/bin/icegate-maintain", "demo"], ".ci/run")
    [block] = shell_blocks("Some prose.\n\n```bash\nls && pwd   # two\n```\n")
    assert block.check == "" and block.commands == [["ls"], ["pwd"]]
