"""The README's example as a newcomer meets it: its files are in ``examples/my-attention/``, and
its command, run there as written, prints every line of the README's excerpt (times aside); its
pytest file, run there, fails the checks the bug fails."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "my-attention"
SECONDS = re.compile(r"in \d+(\.\d+)? s\b")


def _readme_blocks() -> tuple[str, list[str]]:
    """The README's command for the example and the lines of the excerpt after it."""
    text = (ROOT / "README.md").read_text()
    at = text.index("[examples/my-attention/]")
    command = re.search(r"```sh\n(.*?)\n```", text[at:], re.S).group(1).strip()
    excerpt = re.search(r"```\n(.*?)```", text[at + text[at:].index("gets, in"):], re.S).group(1)
    return command, [line for line in excerpt.splitlines() if line.strip() and line != "..."]


def _normal(line: str) -> str:
    return SECONDS.sub("in N s", " ".join(line.split()))


def test_the_readme_command_prints_every_line_of_its_excerpt():
    command, excerpt = _readme_blocks()
    assert command == "attention-conformance check my_attention.py::MyAttention"
    words = command.split()
    done = subprocess.run([sys.executable, "-m", "conformance", *words[1:]], cwd=EXAMPLE,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stderr[-2000:]
    printed = {_normal(line) for line in done.stdout.splitlines()}
    missing = [line for line in excerpt if _normal(line) not in printed]
    assert not missing, "\n".join(missing)


def test_the_example_pytest_file_fails_the_checks_the_bug_fails():
    done = subprocess.run([sys.executable, "-m", "pytest", "test_my_attention.py", "-q",
                           "-p", "no:cacheprovider", "-k", "scale or gate or padding"],
                          cwd=EXAMPLE, capture_output=True, text=True, timeout=300)
    failed = sorted(re.findall(r"FAILED \S+::(\S+)", done.stdout))
    assert failed == ["test_my_attention[MyAttention-scale]"], done.stdout[-3000:]
    assert re.search(r"1 failed, 2 passed", done.stdout), done.stdout[-2000:]


def test_the_readme_names_the_cpu_torch_line_and_every_pin_make_check_installs():
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert "pip install torch --index-url https://download.pytorch.org/whl/cpu" in readme
    pins = [line.split("==") for line in (ROOT / "constraints.txt").read_text().splitlines()
            if "==" in line and not line.startswith("#")]
    assert pins and all(f"{name} {version}" in readme for name, version in pins), pins
    assert "numpy below 2.3" in readme and "numpy<2.3" in (ROOT / "constraints.txt").read_text()
