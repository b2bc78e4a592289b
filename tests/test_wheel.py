"""The package as a user installs it: a wheel in a fresh virtualenv inside their project (their own
``.venv``), their module checked as the README's first screen shows, from the command line and
from pytest.

The wheel is built from this checkout and unpacked into a new virtualenv; its dependencies (torch,
hypothesis, pytest) come from this environment through a ``.pth`` file, so nothing is downloaded.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MY_ATTENTION = (ROOT / "examples" / "my-attention" / "my_attention.py").read_text()
"""The README's example, with its bug (sqrt(d_model) for sqrt(head_dim))."""


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("wheel")
    # Built from a copy of the tracked files: a build in the checkout leaves build/, whose stale
    # modules a later wheel would carry.
    source = root / "source"
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, check=True,
                             capture_output=True, text=True).stdout.split("\0")
    for name in filter(None, tracked):
        if (ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                    "--no-build-isolation", "--wheel-dir", str(root / "dist"), str(source)],
                   check=True, capture_output=True)
    (wheel,) = (root / "dist").glob("attention_conformance-*.whl")
    project = root / "project"
    project.mkdir()
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(project / ".venv")],
                   check=True)
    site = Path(subprocess.run(
        [str(project / ".venv" / "bin" / "python"), "-c",
         "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True).stdout.strip())
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)
    (site / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    (project / "my_attention.py").write_text(MY_ATTENTION)
    return project


def run(project: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(project / ".venv" / "bin" / "python"), *args],
                          capture_output=True, text=True, cwd=project)


def test_only_one_top_level_package_is_installed(project):
    done = run(project, "-c", "import conformance, importlib.util; print(conformance.__file__); "
                              "print(importlib.util.find_spec('implementations'))")
    where, bundled = done.stdout.split()
    assert str(project / ".venv") in where           # the wheel's copy, not this checkout
    assert bundled == "None"


def test_the_first_screen_works_from_the_wheel(project):
    done = run(project, "-m", "conformance", "check", "my_attention.py::MyAttention", "--check",
               "gate", "--check", "scale", "--json", "-")
    assert done.returncode == 1, done.stderr[-2000:]
    results = {r["check"]: r for r in json.loads(done.stdout)["results"]}
    assert results["gate"]["status"] == "passed"
    assert results["scale"]["status"] == "failed"
    assert "did you divide by sqrt(hidden_dim)" in results["scale"]["hint"]


def test_pytest_finds_the_catalogue_in_the_projects_own_virtualenv(project):
    """pytest skips virtualenvs it meets while collecting; the catalogue lives in one here."""
    done = run(project, "-m", "pytest", "-p", "no:cacheprovider", "--attention-impl",
               "my_attention.py::MyAttention", "-k", "test_scale or test_gate")
    failed = re.findall(r"^FAILED (\S+)", done.stdout, re.MULTILINE)
    assert len(failed) == 1 and failed[0].endswith("::test_scale[my_attention.py:MyAttention]"), \
        done.stdout[-3000:]
    assert "1 failed, 1 passed" in done.stdout
    again = run(project, "-m", "pytest", "-p", "no:cacheprovider", "--attention-impl",
                "my_attention.py::MyAttention", failed[0])
    assert re.findall(r"^FAILED (\S+)", again.stdout, re.MULTILINE) == failed
