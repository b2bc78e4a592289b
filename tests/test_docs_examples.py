"""Every example in the README and the docs works as written, so the docs can't drift.

Python blocks run (in a folder holding the user modules they import: ``tests/fixtures/
docs_examples``); a block opening with ``# NAME.py`` is that file, later blocks of the page
import it, and one named ``test_*.py`` is run by pytest (its gate tests). Shell blocks are
parsed by the command line itself: a concrete ``attention-conformance`` command must parse, a
synopsis (with ``[...]``) may name only options that exist; ``pytest`` lines only the plugin's
``--attention-*`` options; ``make`` only the Makefile's targets.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conformance.frontends import cli, pytest_plugin

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
STUBS = ROOT / "tests" / "fixtures" / "docs_examples"
BLOCK = re.compile(r"^```(python|sh)\n(.*?)^```", re.MULTILINE | re.DOTALL)


def _blocks(page: Path, language: str) -> list[tuple[int, str]]:
    text = page.read_text()
    return [(text[:m.start()].count("\n") + 1, m.group(2)) for m in BLOCK.finditer(text)
            if m.group(1) == language]


def _pages_with(language: str) -> list[Path]:
    return [page for page in PAGES if _blocks(page, language)]


def _commands(block: str) -> list[str]:
    """The block's commands: continuation lines joined, comments and blank lines dropped."""
    joined = re.sub(r"\\\n\s*", " ", block)
    commands = []
    for line in joined.splitlines():
        line = re.sub(r"(^|\s)#.*$", "", line).strip()
        if line:
            commands.append(line)
    return commands


def _subparsers() -> dict[str, object]:
    parser = cli._parser()
    (action,) = [a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction"]
    return dict(action.choices)


def _options(parser) -> set[str]:
    return {option for action in parser._actions for option in action.option_strings}


class _Recorder:
    """Records the options the pytest plugin adds."""

    def __init__(self) -> None:
        self.names: set[str] = set()

    def getgroup(self, *args, **kwargs):
        return self

    def addoption(self, *names, **kwargs):
        self.names.update(names)

    def addini(self, *args, **kwargs):
        pass


def _check_shell(command: str, subcommands: dict, plugin: set[str],
                 targets: set[str]) -> str | None:
    """What is wrong with ``command`` as the docs give it, or None."""
    words = command.split()
    if words[:3] == ["python", "-m", "conformance"]:
        words = ["attention-conformance", *words[3:]]
    if words[0] == "attention-conformance":
        synopsis = "[" in command or "..." in command
        if synopsis:
            sub = subcommands.get(words[1]) if len(words) > 1 else None
            known = _options(sub) if sub is not None else _options(cli._parser())
            flags = {f.split("=")[0].strip("[]") for f in re.findall(r"--[a-z][\w-]*", command)}
            flags = {f.replace("--[no-]", "--") for f in flags}
            unknown = sorted(f for f in flags if f not in known and f != "--no-isolate"
                             and f.removeprefix("--no-") not in {k.removeprefix("--")
                                                                 for k in known})
            return f"unknown option(s) {unknown}" if unknown else None
        try:
            cli._parser().parse_args(shlex.split(command)[1:])
        except SystemExit as stop:  # --help, --version: exit 0
            return None if stop.code == 0 else f"does not parse (exit {stop.code})"
        return None
    if words[0] == "pytest":
        unknown = [w.split("=")[0] for w in words
                   if w.startswith("--attention") and w.split("=")[0] not in plugin]
        return f"unknown pytest option(s) {unknown}" if unknown else None
    if words[0] == "make":
        missing = [w for w in words[1:] if w not in targets]
        return f"no make target(s) {missing}" if missing else None
    return None  # pip, shell utilities: not the suite's to parse


@pytest.mark.parametrize("page", _pages_with("sh"), ids=lambda p: p.name)
def test_every_shell_command_is_one_the_tools_accept(page, capsys):
    subcommands = _subparsers()
    recorder = _Recorder()
    pytest_plugin.pytest_addoption(recorder)
    targets = set(re.findall(r"^([a-z][\w-]*):", (ROOT / "Makefile").read_text(), re.M))
    problems = []
    for line, block in _blocks(page, "sh"):
        for command in _commands(block):
            problem = _check_shell(command, subcommands, recorder.names, targets)
            if problem:
                problems.append(f"{page.name}:{line}: {command[:80]}: {problem}")
    capsys.readouterr()  # argparse's own usage lines
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("page", _pages_with("python"), ids=lambda p: p.name)
def test_every_python_example_runs(page, tmp_path):
    work = tmp_path / "work"
    shutil.copytree(STUBS, work)
    environment = {"PYTHONPATH": str(work), "PATH": "/usr/bin:/bin",
                   "HOME": str(tmp_path), "CI": "true"}
    for line, block in _blocks(page, "python"):
        first = block.splitlines()[0].strip()
        named = re.fullmatch(r"#\s*([\w.]+\.py)\b.*", first)
        path = work / (named.group(1) if named else f"block_{line}.py")
        path.write_text(block)
        if path.name.startswith("test_"):
            command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                       str(path), "-k", "gate"]
        else:
            command = [sys.executable, str(path)]
        done = subprocess.run(command, cwd=work, env=environment, capture_output=True,
                              text=True, timeout=600)
        assert done.returncode == 0, (f"{page.name}:{line} ({path.name}):\n"
                                      f"{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
