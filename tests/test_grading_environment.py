"""A submission that imports a package the grading environment lacks: the environment's problem,
for the teacher's look ("needs package ..."), no grade rather than a 0; installing the package
makes a plain rerun regrade it (the results store's key includes the installed packages).

The package is installed for real, as ``pip install`` would leave it (a module and its
``.dist-info`` in this environment's site-packages), and removed afterwards.
"""

from __future__ import annotations

import csv
import importlib.util
import shutil
import sysconfig
import textwrap
from pathlib import Path

import pytest

from conformance.grading.pipeline import grade_class
from conformance.grading.run import store
from conformance.grading.score.outcome import RunStatus
from tests.test_grading_execution import ATTENTION, CORRECT, rubric

PACKAGE = "natten"
"""A package on PyPI that attention code imports (neighbourhood attention), not installed here:
one of ``registry.KNOWN_PACKAGES``, so its absence is the environment's."""


@pytest.fixture
def installable():
    """Installs PACKAGE when called; whatever happened, it is removed at the end."""
    if importlib.util.find_spec(PACKAGE) is not None:
        pytest.skip(f"{PACKAGE} is really installed here: the test would replace it")
    site = Path(sysconfig.get_paths()["purelib"])
    module, info = site / f"{PACKAGE}.py", site / f"{PACKAGE}-1.0.dist-info"

    def install() -> None:
        module.write_text("SCALE = 1.0\n")
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {PACKAGE}\nVersion: 1.0\n")
        store.environment.cache_clear()  # a new process would read it afresh

    try:
        yield install
    finally:
        module.unlink(missing_ok=True)
        shutil.rmtree(info, ignore_errors=True)
        store.environment.cache_clear()


def _grades(out: Path) -> dict[str, dict[str, str]]:
    with (out / "grades.csv").open() as handle:
        return {row["id"]: row for row in csv.DictReader(handle) if row["id"] != "Points Possible"}


def test_a_missing_package_is_the_environments_and_installing_it_regrades(tmp_path, installable):
    download = tmp_path / "download"
    (download / "needs_it").mkdir(parents=True)
    (download / "needs_it" / "attention.py").write_text(
        f"import {PACKAGE}\n" + ATTENTION + textwrap.indent(textwrap.dedent(CORRECT), "    "))
    graded_rubric, out = rubric(tmp_path), tmp_path / "out"

    first = grade_class(download, graded_rubric, out)
    (student,) = first.students
    assert student.status is RunStatus.MISSING_PACKAGE
    assert f"needs package '{PACKAGE}', which is not installed here" in student.outcome.message
    row = _grades(out)["needs_it"]
    assert row["status"] == "missing package" and row["total"] == "" and row["percent"] == ""
    assert "needs_it" in (out / "class_report.md").read_text()

    installable()
    second = grade_class(download, graded_rubric, out)  # a plain rerun: nothing forced
    assert second.graded == ["needs_it"] and not second.reused
    row = _grades(out)["needs_it"]
    assert row["status"] == "graded" and float(row["total"]) == 3


def test_a_module_of_the_students_own_left_out_is_their_import_error(tmp_path):
    """``from utils import ...`` with no utils.py submitted: the student's import error, said
    so, never a package for the teacher to install."""
    download = tmp_path / "download"
    (download / "forgot_it").mkdir(parents=True)
    (download / "forgot_it" / "attention.py").write_text(
        "from utils import helper\n" + ATTENTION
        + textwrap.indent(textwrap.dedent(CORRECT), "    "))
    (student,) = grade_class(download, rubric(tmp_path), tmp_path / "out").students
    assert student.status is RunStatus.IMPORT_ERROR
    assert "utils.py not submitted" in student.outcome.message
    assert "pip install" not in student.outcome.message
