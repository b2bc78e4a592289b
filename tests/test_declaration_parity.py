"""One declaration, five ways in, one verdict: a command-line flag, a pyproject.toml table,
pytest's --attention-declare, parametrize_with_checks(declare=...) and conformance.check(declare=...)
give the same results for the same module."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from xml.etree import ElementTree

import conformance
from conformance.frontends.cli import main

FIXTURES = Path(__file__).parent / "fixtures"
CHECKS = ["gate", "padding", "mask_formats"]
# InvertedAttentionMask reads `attention_mask` with 1 = masked: the name says the reverse, so
# undeclared its padding fails; declared as what it does, it passes.
MASK = "ignore_bool:key_padding@attention_mask"


def _pytest_verdicts(folder: Path, *args: str) -> dict[str, str]:
    """{check: PASSED | FAILED | SKIPPED} of a pytest run, read from its JUnit XML."""
    report = folder / "junit.xml"
    subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--junitxml",
                    str(report), *args], capture_output=True, text=True, cwd=folder,
                   env={**os.environ, "PYTHONPATH": str(folder)})
    found = {}
    for case in ElementTree.parse(report).iter("testcase"):
        name = case.get("name", "")
        check = name[len("test_"):name.index("[")] if name.startswith("test_") and "[" in name \
            and not name.startswith("test_attention[") else name.rsplit("-", 1)[-1].rstrip("]")
        outcome = ("FAILED" if case.find("failure") is not None else
                   "SKIPPED" if case.find("skipped") is not None else "PASSED")
        found[check] = outcome
    return found


def test_the_same_declaration_gives_the_same_verdicts_wherever_it_is_made(tmp_path, capsys):
    shutil.copy(FIXTURES / "user_impls.py", tmp_path / "my_attention.py")
    spec = f"{tmp_path / 'my_attention.py'}::InvertedAttentionMask"
    status = {"passed": "PASSED", "failed": "FAILED", "skipped": "SKIPPED", "warning": "WARNED"}

    def cli(*extra: str, cwd: Path | None = None) -> dict[str, str]:
        report = tmp_path / "r.json"
        previous = os.getcwd()
        os.chdir(cwd or previous)
        try:
            main(["check", spec, *(f"--check={c}" for c in CHECKS), "--no-isolate", "--json",
                  str(report), *extra])
        finally:
            os.chdir(previous)
        capsys.readouterr()
        return {r["check"]: status[r["status"]] for r in json.loads(report.read_text())["results"]}

    bare = cli()
    flag = cli("--mask", MASK)
    assert bare["padding"] == "WARNED" and flag["padding"] == "PASSED"

    from tests.fixtures.user_impls import InvertedAttentionMask
    api = {r.check: status[r.status.value] for r in conformance.check(
        InvertedAttentionMask, checks=CHECKS, devices=["cpu"], declare={"mask": MASK})}
    assert api == flag

    project = tmp_path / "project"
    project.mkdir()
    (project / "pyproject.toml").write_text(
        f'[tool.attention-conformance.declare."{spec}"]\nmask = "{MASK}"\n')
    assert cli(cwd=project) == flag

    plugin = _pytest_verdicts(tmp_path, "--attention-impl", "my_attention.py::InvertedAttentionMask",
                              "--attention-declare", f"mask={MASK}", "--attention-device", "cpu",
                              "-k", " or ".join(f"test_{c}" for c in CHECKS))
    assert plugin == flag

    (tmp_path / "test_mine.py").write_text(
        "from conformance.testing import parametrize_with_checks\n"
        "from my_attention import InvertedAttentionMask\n\n"
        f"@parametrize_with_checks(InvertedAttentionMask, checks={CHECKS!r}, devices=['cpu'],\n"
        f"                         declare={{'mask': {MASK!r}}})\n"
        "def test_attention(attention_check):\n"
        "    attention_check()\n")
    assert _pytest_verdicts(tmp_path, "test_mine.py") == flag
