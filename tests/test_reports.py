"""The reports a person or a CI system reads: the HTML page with each finding's minimal case drawn
(check --html, pytest --attention-html), JUnit XML in the schema pytest's own is held to, and
GitHub Actions annotations at the implementation's class line."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest

from conformance.frontends import picture_figure
from conformance.frontends.github_annotations import annotations, located
from conformance.frontends.html_report import render_html
from conformance.frontends.junit_report import render_junit
from conformance.implementations import bundled
from conformance.model.check_names import CHECK_NAMES
from conformance.model.results import Status
from conformance.run.many import check_many

ROOT = Path(__file__).resolve().parent.parent
BUNDLED = {impl.name: impl for impl in bundled()}
MUTANTS = ("mutant-mask-inverted", "mutant-causal-shows-next-token")
"""A mask read the wrong way and a causal boundary one key late: bugs that are a picture."""


@pytest.fixture(scope="module")
def drawn():
    """The two mutants' verdicts, each finding's minimal case drawn."""
    return check_many([(name, BUNDLED[name]) for name in MUTANTS], devices=["cpu"],
                      pictures=True)


def _leaks(picture) -> list[tuple[int, int]]:
    """Cells where the implementation puts weight on a key the row may not see."""
    return [(row, key) for row, (weights, allowed) in enumerate(
                zip(picture.measured, picture.allowed, strict=True))
            for key, (weight, may) in enumerate(zip(weights, allowed, strict=True))
            if not may and not weight <= picture_figure.LEAK]


def test_the_picture_shows_where_the_mask_leaks(drawn):
    """The inverted mask's padding finding: drawn at a size the eye can read, its weight lies on
    exactly the keys the mask hides, and the reference's never does."""
    (padding,) = [r for r in drawn if r.implementation == MUTANTS[0] and r.check == "padding"]
    picture = padding.picture
    assert picture is not None and picture.measured is not None
    assert len(picture.measured[0]) >= 4
    masked = {key for key, kept in enumerate(picture.kept) if not kept}
    assert masked and {key for _, key in _leaks(picture)} == masked
    assert all(picture.reference[row][key] == 0.0 for row in range(len(picture.reference))
               for key in masked)


def test_the_picture_shows_a_row_seeing_its_next_token(drawn):
    """The causal mutant's causal finding: each leak is the key just past the causal boundary."""
    (causal,) = [r for r in drawn if r.implementation == MUTANTS[1] and r.check == "causal"]
    picture = causal.picture
    assert picture is not None and picture.causal and picture.measured is not None
    leaks = _leaks(picture)
    assert leaks and all(key == row + 1 for row, key in leaks)


@pytest.mark.skipif(not picture_figure.available(), reason="matplotlib (the [plot] extra) is "
                    "not installed")
def test_the_page_is_self_contained_and_draws_every_finding(drawn):
    """Every finding drawn, probabilities or a row's error alike (a few of each mutant's: a
    figure takes a second to draw), and nothing the page would fetch."""
    shown = [r for r in drawn if r.check in ("padding", "causal", "head_split", "gate")]
    page = render_html(shown, checks=CHECK_NAMES, profile="quick", devices=["cpu"], seconds=1.0)
    findings = [r for r in shown if r.status in (Status.FAILED, Status.WARNED,
                                                 Status.EXPECTED_FAILURE)]
    assert len(findings) >= 3
    assert page.count("<img class=picture") == sum(
        r.picture is not None and (r.picture.measured is not None or r.picture.row_error is not None)
        for r in findings)
    assert "src='http" not in page and 'href="http' not in page and "<script" not in page


def test_without_matplotlib_the_page_has_the_tables_and_says_what_to_install(drawn, monkeypatch):
    monkeypatch.setattr(picture_figure, "available", lambda: False)
    page = render_html(drawn, checks=CHECK_NAMES, profile="quick", devices=["cpu"], seconds=1.0)
    assert picture_figure.INSTALL in page and "<img" not in page
    assert "mutant-mask-inverted · padding" in page


def test_the_junit_file_validates_against_pytests_schema(drawn, tmp_path):
    """One testcase per check and device; an expected failure is skipped as pytest writes an
    xfail; a failure carries its reason and the command that replays it."""
    xmlschema = pytest.importorskip("xmlschema")
    text = render_junit(drawn, seconds=2.5,
                        reproduce=lambda r: f"attention-conformance check {r.implementation} "
                                            f"--check {r.check} --replay \"{r.counterexample}\"")
    path = tmp_path / "junit.xml"
    path.write_text(text, encoding="utf-8")
    xmlschema.XMLSchema(str(ROOT / "tests" / "fixtures" / "junit-10.xsd")).validate(str(path))
    cases = ElementTree.parse(path).getroot().findall("./testsuite/testcase")
    assert len(cases) == len(drawn)
    xfails = [c for c in cases if c.find("skipped") is not None
              and c.find("skipped").get("type") == "xfail"]
    assert len(xfails) == sum(r.status is Status.EXPECTED_FAILURE for r in drawn)
    assert all("replay it: attention-conformance check" in c.find("skipped").text for c in xfails)


def test_a_failure_is_a_junit_failure_and_a_github_error_at_the_class_line(tmp_path):
    """Through the command line, on a file: the JUnit testcase fails; on GitHub Actions each
    finding is an annotation at the class's own line."""
    module = tmp_path / "attention.py"
    source = (ROOT / "conformance" / "implementations" / "mutants" / "scale_missing.py")
    module.write_text(source.read_text(encoding="utf-8"), encoding="utf-8")
    line = next(number for number, text in enumerate(module.read_text().splitlines(), 1)
                if text.startswith("class ScaleMissing"))
    env = {**os.environ, "GITHUB_ACTIONS": "true", "GITHUB_WORKSPACE": str(tmp_path)}
    env.pop("CI", None)
    done = subprocess.run([sys.executable, "-m", "conformance", "check",
                           "attention.py::ScaleMissing", "--junit-xml", "out.xml",
                           "--check", "scale", "--check", "reference", "--no-progress"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stderr
    errors = [text for text in done.stdout.splitlines() if text.startswith("::error ")]
    assert errors and all(f"file=attention.py,line={line}," in text for text in errors)
    failures = ElementTree.parse(tmp_path / "out.xml").getroot().findall(".//failure")
    assert failures and all("replay it: attention-conformance check" in f.text for f in failures)


def test_annotations_escape_what_github_reads_as_syntax():
    from conformance.model.results import CheckResult

    result = CheckResult("a::B", "scale", "cpu", Status.WARNED, reason="50% off\nnext: line")
    (line,) = annotations([result], lambda name: ("x.py", 3))
    assert line == ("::warning file=x.py,line=3,title=a%3A%3AB · scale [cpu]::50%25 off%0Anext: "
                    "line")
    assert located("no_such_file.py::A") is None


@pytest.mark.skipif(shutil.which("chromium") is None and shutil.which("chromium-browser") is None,
                    reason="headless Chromium is not installed (apt-get install chromium)")
@pytest.mark.skipif(not picture_figure.available(), reason="matplotlib is not installed")
def test_the_page_as_a_person_sees_it(drawn, tmp_path):
    """The page rendered by a browser: the figures are on screen, leaks outlined in red."""
    from matplotlib.image import imread

    page = tmp_path / "report.html"
    page.write_text(render_html([r for r in drawn if r.implementation == MUTANTS[0]
                                 and r.check == "padding"], checks=["padding"],
                                profile="quick", devices=["cpu"], seconds=1.0),
                    encoding="utf-8")
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    shot = tmp_path / "shot.png"
    subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu",
                    "--hide-scrollbars", "--window-size=1200,1400", f"--screenshot={shot}",
                    page.as_uri()], capture_output=True, timeout=120, check=False)
    pixels = imread(str(shot))[..., :3]
    red = (pixels[..., 0] > 0.85) & (pixels[..., 1] < 0.2) & (pixels[..., 2] < 0.2)
    coloured = pixels.std(axis=-1) > 0.1
    assert red.sum() > 50, "no leak outlined in red on screen"
    assert coloured.mean() > 0.05, "no figure on screen"


def test_pytest_writes_the_page_from_its_workers(tmp_path):
    """``pytest --attention-html`` under pytest-xdist: each verdict travels with its test's
    report to the process that writes the page, its minimal case drawn."""
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "--pyargs", "conformance", "--attention-impl", "mutant-mask-inverted",
                           "--attention-html", "page.html", "-n", "1", "-k",
                           "padding or causal or gate"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:]
    page = (tmp_path / "page.html").read_text(encoding="utf-8")
    assert "attention-conformance: 3 verdict(s)" in done.stdout
    assert "XFAIL mutant-mask-inverted · padding [cpu]" in page
    if picture_figure.available():
        assert "<img class=picture" in page


def test_a_module_that_refuses_the_larger_case_gets_its_minimal_case_drawn():
    """The larger case is an illustration: where the module does not build at that size, the
    minimal case's own picture is drawn (each row's output error), not nothing."""
    from dataclasses import replace

    from conformance.checks.picture import picture
    from conformance.generation.cases import Case
    from conformance.subject.in_process import InProcessSubject

    inverted = BUNDLED["mutant-mask-inverted"]

    def small_only(config):
        if config.head_dim > 4:
            raise ValueError("head_dim > 4 is not supported")
        return inverted.factory(config)

    impl = replace(inverted, factory=small_only)
    case = Case(batch=1, q_len=2, kv_len=2, num_heads=2, head_dim=1, kept=(1,))
    drawn = picture(InProcessSubject(impl), impl.capabilities, case, "changed output row 0")
    assert drawn.row_error is not None and drawn.row_error[0] > 0.1, drawn
