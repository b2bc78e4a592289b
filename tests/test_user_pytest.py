"""Users' pytest: --attention-impl from their own repository, parametrize_with_checks in their
own test file, an expected-failures file (pytest and CLI)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from conformance.frontends.cli import main

FIXTURES = Path(__file__).parent / "fixtures"


def run_pytest(directory: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(FIXTURES)}
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA", *args],
                          capture_output=True, text=True, cwd=directory, env=env)


def test_attention_impl_from_a_users_own_repository(tmp_path):
    (tmp_path / "test_theirs.py").write_text("def test_their_own():\n    assert True\n")
    done = run_pytest(tmp_path, "--attention-impl", "user_styles:EinsumAttention", "-k",
                      "gate or padding or own")
    assert done.returncode == 0, done.stdout[-3000:]
    assert "test_padding[user_styles:EinsumAttention]" in done.stdout
    assert "PASSED test_theirs.py::test_their_own" in done.stdout
    assert "attention-conformance: implementations under test: user_styles:EinsumAttention" \
        in done.stdout
    # What inference settled, in pytest's words, before any verdict.
    assert "Interface (inferred; items marked declared were given):" in done.stdout
    assert "--attention-declare" in done.stdout


def test_parametrize_with_checks_in_a_users_test_file(tmp_path):
    (tmp_path / "test_mine.py").write_text(
        "from conformance.testing import parametrize_with_checks\n"
        "from user_styles import FusedQKV\n"
        "from user_impls import wrong_scale\n\n"
        "@parametrize_with_checks(FusedQKV, wrong_scale, checks=['gate', 'head_split'],\n"
        "                         expected_failures={'user-wrong-scale': {'head_split': 'known'}})\n"
        "def test_attention(attention_check):\n"
        "    attention_check()\n")
    done = run_pytest(tmp_path, "test_mine.py")
    assert done.returncode == 0, done.stdout[-3000:]
    assert "PASSED test_mine.py::test_attention[FusedQKV-head_split]" in done.stdout
    assert "XFAIL test_mine.py::test_attention[user-wrong-scale-head_split]" in done.stdout
    assert "test_attention[FusedQKV-gate-cuda]" in done.stdout or "cuda" in done.stdout


def test_xfails_file_in_pytest_and_the_cli(tmp_path, capsys):
    xfails = tmp_path / "xfails.toml"
    xfails.write_text('["user-wrong-scale"]\nhead_split = "divides by sqrt(d_model)"\n')
    done = run_pytest(tmp_path, "--attention-impl", "user_impls:wrong_scale", "--attention-xfails",
                      str(xfails), "-k", "head_split")
    assert done.returncode == 0, done.stdout[-3000:]
    assert "XFAIL" in done.stdout and "divides by sqrt(d_model)" in done.stdout

    spec = f"{FIXTURES / 'user_impls.py'}::wrong_scale"
    assert main(["check", spec, "--check", "gate", "--check", "head_split",
                 "--expected-failures", str(xfails)]) == 0
    assert main(["check", spec, "--check", "gate", "--check", "head_split"]) == 1
    bad = tmp_path / "bad.toml"
    bad.write_text('["user-wrong-scale"]\nno_such_check = "x"\n')
    assert main(["check", spec, "--expected-failures", str(bad)]) == 2
    assert "unknown check(s) ['no_such_check']" in capsys.readouterr().err


def test_xdist_and_junitxml(tmp_path):
    report = tmp_path / "report.xml"
    done = run_pytest(tmp_path, "-n", "2", "--junitxml", str(report), "--hypothesis-seed", "3",
                      "--attention-impl",
                      "user_styles:FusedQKV", "-k", "gate or padding or contract")
    assert done.returncode == 0, done.stdout[-3000:]
    xml = report.read_text()
    assert 'name="test_padding[user_styles:FusedQKV]"' in xml
    assert "failures=\"0\"" in xml or "failures='0'" in xml


def test_every_failing_id_pasted_back_reruns_that_test(tmp_path):
    """The catalogue's module lives with the suite, outside the user's repository: pytest prints
    its ids as ``::test_x[...]``, and a file implementation's name carries ``::``; both paste."""
    import re
    import shutil

    shutil.copy(FIXTURES / "user_impls.py", tmp_path / "my_attention.py")
    spec = "my_attention.py::WrongScaleAttention"
    done = run_pytest(tmp_path, "-q", "--attention-impl", spec, "-k",
                      "test_head_split or test_scale")
    failed = re.findall(r"^FAILED (\S+)", done.stdout, re.MULTILINE)
    assert failed == ["::test_head_split[my_attention.py:WrongScaleAttention]",
                      "::test_scale[my_attention.py:WrongScaleAttention]"], done.stdout[-2000:]
    for node in failed:
        again = run_pytest(tmp_path, "-q", "--attention-impl", spec, node)
        assert re.findall(r"^FAILED (\S+)", again.stdout, re.MULTILINE) == [node], \
            again.stdout[-2000:] + again.stderr[-2000:]
        assert "1 failed" in again.stdout


def test_one_front_door_for_classes_instances_functions_and_declarations(tmp_path):
    """parametrize_with_checks takes what the command line takes (a class, an instance, a core
    function), the pyproject table of declarations, and the run's profile."""
    (tmp_path / "test_front.py").write_text(
        "from conformance.testing import parametrize_with_checks\n"
        "from user_impls import PlainAttention, InvertedAttentionMask\n"
        "from core_functions import attention\n\n"
        "@parametrize_with_checks(PlainAttention(8, 2), attention, InvertedAttentionMask,\n"
        "                         checks=['gate', 'padding'])\n"
        "def test_attention(attention_check):\n"
        "    attention_check()\n")
    # InvertedAttentionMask reads `attention_mask` with 1 = masked: the name says the reverse,
    # which only intent settles: undeclared, a warning naming both readings; declared as what
    # it does, padding holds.
    bare = run_pytest(tmp_path, "test_front.py")
    assert "PASSED test_front.py::test_attention[PlainAttention-padding]" in bare.stdout
    assert "PASSED test_front.py::test_attention[attention-padding]" in bare.stdout
    assert "PASSED test_front.py::test_attention[InvertedAttentionMask-padding]" in bare.stdout
    assert ('pass declare={"mask": "ignore_bool:key_padding@attention_mask"} to hold it'
            in bare.stdout)
    # Its advice speaks the test file's language: declare=..., not a command-line flag.
    assert 'declare={"mask":' in bare.stdout and " --mask " not in bare.stdout
    (tmp_path / "pyproject.toml").write_text(
        '[tool.attention-conformance.declare."user_impls:InvertedAttentionMask"]\n'
        'mask = "ignore_bool:key_padding@attention_mask"\n')
    declared = run_pytest(tmp_path, "test_front.py", "--attention-profile", "thorough")
    assert declared.returncode == 0, declared.stdout[-3000:]
    assert "PASSED test_front.py::test_attention[InvertedAttentionMask-padding]" in \
        declared.stdout


def test_an_unknown_check_name_is_an_error_with_a_suggestion(tmp_path):
    (tmp_path / "test_typo.py").write_text(
        "from conformance.testing import parametrize_with_checks\n"
        "from user_impls import PlainAttention\n\n"
        "@parametrize_with_checks(PlainAttention,\n"
        "                         expected_failures={'PlainAttention': {'paddng': 'why'}})\n"
        "def test_attention(attention_check):\n"
        "    attention_check()\n")
    done = run_pytest(tmp_path, "test_typo.py")
    assert done.returncode != 0
    assert "unknown check 'paddng' (did you mean padding?)" in done.stdout + done.stderr


def test_conformance_check_takes_a_class_and_declarations():
    import conformance
    from tests.fixtures.user_impls import InvertedAttentionMask, WrongScaleAttention

    results = conformance.check(WrongScaleAttention, checks=["gate", "scale"], devices=["cpu"])
    assert [(r.implementation, r.check, r.status.value) for r in results] == [
        ("WrongScaleAttention", "gate", "passed"), ("WrongScaleAttention", "scale", "failed")]
    bare = conformance.check(InvertedAttentionMask, checks=["padding"], devices=["cpu"])
    declared = conformance.check(InvertedAttentionMask, checks=["padding"], devices=["cpu"],
                                 declare={"mask": "ignore_bool:key_padding@attention_mask"})
    assert (bare[0].status.value, declared[0].status.value) == ("warning", "passed")
