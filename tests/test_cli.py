"""The command line: matrix, JSON, exit codes, and one clear line for bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conformance import CHECK_NAMES
from conformance.frontends.cli import main

FIXTURES = Path(__file__).parent / "fixtures"
USER = f"{FIXTURES / 'user_impls.py'}::"


def run(capsys, *args):
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_matrix_failure_block_and_summary(capsys):
    code, out, _ = run(capsys, "check", "seed004-MultiHeadAttention", "mutant-mask-after-softmax")
    assert code == 0  # every failure is an expected one
    lines = out.splitlines()
    # Lines fit 100 columns, but the replay command: it is pasted whole.
    assert all(len(line) <= 100 for line in lines if not line.startswith("  replay it: "))
    # The matrix, cut into blocks of checks that fit 100 columns.
    headers = [i for i, line in enumerate(lines) if line.startswith("implementation ")]
    assert len(headers) > 1
    shown, verdicts = [], {}
    for at in headers:
        block = lines[at].split()[1:]
        row = lines[at + 1].split()
        assert row[0] == "seed004-MultiHeadAttention"
        shown += block
        verdicts.update(zip(block, row[1:], strict=True))
    assert shown == list(CHECK_NAMES)
    assert verdicts["gate"] == "PASS" and verdicts["contract"] == "XFAIL"
    assert verdicts["causal"] == "SKIP" and verdicts["padding"] == "PASS"
    assert "cuda: not available, skipped" in lines[1]
    assert "XFAIL mutant-mask-after-softmax · padding [cpu]" in out
    assert "Falsifying example: padding(\n      case=Case(" in out
    assert "replay it: attention-conformance check mutant-mask-after-softmax --check padding " \
        '--replay "Case(' in out
    assert "OK: no unexpected failure" in out


def test_unexpected_failure_exits_1_and_json_matches(capsys, tmp_path):
    report = tmp_path / "r.json"
    code, out, _ = run(capsys, "check", USER + "wrong_scale", "--json", str(report),
                       "--check", "gate", "--check", "head_split", "--check", "scale")
    assert code == 1
    assert "FAIL  user-wrong-scale · head_split [cpu]" in out
    data = json.loads(report.read_text())
    statuses = {r["check"]: r["status"] for r in data["results"]}
    assert statuses == {"gate": "passed", "head_split": "failed", "scale": "failed"}
    assert data["summary"]["ok"] is False and data["profile"] == "quick"
    assert data["implementations"][0]["declares"].startswith("self-attention")


def test_module_attr_form(capsys):
    code, out, _ = run(capsys, "check", "tests.fixtures.user_impls:plain", "--check", "gate")
    assert code == 0 and "user-plain" in out


@pytest.mark.parametrize("spec,message", [
    ("no-such-impl", "no implementation named 'no-such-impl'"),
    ("no_such_pkg.mod:Thing", "cannot import module no_such_pkg.mod"),
    (f"{FIXTURES / 'missing.py'}::X", "no file"),
    (f"{FIXTURES / 'syntax_error.py'}::X", "syntax error in"),
    (USER + "nope", "has no attribute 'nope'"),
    (USER + "plian", "has no attribute 'plian'; did you mean 'plain'? (it defines plain, "),
    (f"{FIXTURES / 'user_impls.py'}:plain",
     "user_impls.py is a file: name what is in it with '::' ("),
    (USER + "not_checkable", "is a int, not an nn.Module, callable or Implementation"),
    (USER + "not_attention", "a core function takes (q, k, v[, mask][, causal])"),
    (USER + "bad_constructor", "user-bad-constructor: constructing it raised TypeError"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, spec, message):
    code, out, err = run(capsys, "check", spec)
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1 and message in err and "Traceback" not in err


def test_version_answered_before_any_heavy_import():
    """The command's ``--version`` prints the parser's line without importing torch or the CLI."""
    probe = ("import sys; from conformance.frontends.entry import main; code = main(['--version']); "
             "print(code, 'torch' in sys.modules, 'conformance.frontends.cli' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    from conformance import __version__
    assert done.stdout == f"attention-conformance {__version__}\n0 False False\n"


def test_version_and_json_on_stdout(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    from conformance import __version__
    assert capsys.readouterr().out == f"attention-conformance {__version__}\n"
    code, out, err = run(capsys, "check", USER + "plain", "--check", "gate", "--json", "-")
    assert code == 0
    assert json.loads(out)["results"][0]["status"] == "passed"   # stdout is the JSON alone
    assert "1 implementation(s): 1 passed" in err                 # the report went to stderr
    assert not Path("-").exists()


def test_bad_constructor_says_where(capsys):
    _, _, err = run(capsys, "check", USER + "bad_constructor")
    assert "user_impls.py:" in err


def test_debug_shows_the_traceback(capsys):
    code, _, err = run(capsys, "check", "--debug", USER + "bad_constructor")
    assert code == 2 and "Traceback" in err


def test_python_dash_m_and_list():
    listing = subprocess.run([sys.executable, "-m", "conformance", "list"], capture_output=True,
                             text=True, check=True).stdout
    assert "seed002-MultiHeadAttention" in listing and "reference-sdpa" in listing
    assert "the checks: attention-conformance list --checks" in listing


def test_list_checks_names_every_check_what_it_asserts_and_when_it_applies(capsys):
    from conformance.checks.catalogue import CATALOGUE, GATE
    from conformance.model.check_names import CHECK_NAMES

    code, out, _ = run(capsys, "list", "--checks")
    assert code == 0
    lines = out.splitlines()
    named = [line.split()[0] for line in lines if line and not line[0].isspace()
             and line.split()[0] in CHECK_NAMES]
    assert tuple(named) == CHECK_NAMES  # every check, in report order
    for check in (GATE, *CATALOGUE):
        at = next(i for i, line in enumerate(lines) if line.startswith(check.name + " "))
        assert check.title in lines[at] and lines[at + 1].strip() == f"applies to: {check.applies}"
    assert "applies to: grouped key/value heads" in out and "applies to: a KV cache" in out
    helped = subprocess.run([sys.executable, "-m", "conformance", "check", "--help"],
                            capture_output=True, text=True, check=True).stdout
    assert "attention-conformance list --checks" in " ".join(helped.split())


def test_an_undeclared_class_is_inferred_and_checked(capsys):
    code, out, _ = run(capsys, "check", USER + "undeclared_class", "--check", "gate",
                       "--check", "padding")
    assert code == 0
    assert "Interface (inferred; items marked declared were given):" in out
    assert "mask: additive float mask, finfo.min = masked, shape (B, 1, 1, Lk) (probed" in out


def test_the_zygote_starts_early_only_where_this_process_will_fork_workers():
    """The command line starts the workers' zygote before its own imports when this process will
    check a file or module isolated, or grade; not for bundled names, --no-isolate, option
    values that look like module paths, or several targets checked in processes of their own."""
    from conformance.frontends.entry import _will_fork_workers as early

    assert early(["check", "my_attention.py::MyAttention"])
    assert early(["check", "pkg.attention:Attention", "other.py::Other"])  # one process
    assert early(["grade", "submissions", "--rubric", "rubric.toml", "--jobs", "2"])  # threads
    assert not early(["check", "a.py::A", "b.py::B", "--jobs", "2"])
    assert not early(["check", "a.py::A", "b.py::B", "-j0"])
    assert not early(["check", "textbook", "--mask", "keep_bool:broadcast"])
    assert not early(["check", "my_attention.py::MyAttention", "--no-isolate"])
    assert not early(["grade", "--no-sandbox", "submissions", "--rubric", "rubric.toml"])
    assert not early(["list"]) and not early([])


def test_a_run_that_checked_nothing_is_never_ok(capsys, tmp_path):
    """Every check skipped on the only device asked for (cuda, absent here): exit 2, said per
    device, and the JSON is not ok; beside a device that checked something, said but no exit 2."""
    report = tmp_path / "r.json"
    code, out, _ = run(capsys, "check", "textbook", "--device", "cuda", "--json", str(report))
    assert code == 2
    assert "Nothing checked: textbook on cuda (cuda is not available on this machine)" in out
    assert "NOTHING CHECKED" in out and "OK: no unexpected failure" not in out
    summary = json.loads(report.read_text())["summary"]
    assert summary["ok"] is False
    assert summary["unchecked"] == [{"implementation": "textbook", "device": "cuda",
                                     "why": "cuda is not available on this machine"}]
    code, out, _ = run(capsys, "check", "textbook", "--device", "cpu", "--device", "cuda",
                       "--check", "gate")
    assert code == 0 and "Nothing checked: textbook on cuda" in out


def test_an_unknown_device_is_one_line(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["check", "textbook", "--device", "cpu,cuda"])
    assert exited.value.code == 2
    assert "unknown device 'cpu,cuda'" in capsys.readouterr().err
