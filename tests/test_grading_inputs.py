"""From an LMS download to staged, hashed files: discovery, archives, notebooks, targets."""

from __future__ import annotations

import io
import json
import os
import textwrap
import zipfile
from pathlib import Path

import pytest

from conformance.grading.intake.archives import ArchiveError, ArchiveLimits, extract_zip
from conformance.grading.intake.discovery import discover, safe_id
from conformance.grading.intake.notebooks import NotebookError, convert
from conformance.grading.intake.staging import stage, tree_hash
from conformance.grading.run.targets import Location, locate, near_misses, scan
from conformance.grading.score.outcome import RunStatus, TargetOutcome
from conformance.grading.score.rubric_file import load

EXAMPLE = Path(__file__).parents[1] / "examples" / "attention-assignment"


def touch(path: Path, text: str = "x = 1\n") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def make_zip(path: Path, members: dict[str, str | bytes], *, modes: dict[str, int] | None = None) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in members.items():
            info = zipfile.ZipInfo(name, date_time=(2026, 1, 1, 0, 0, 0))
            info.external_attr = (modes or {}).get(name, 0o100644) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, data)
    return path


def test_the_example_download_is_one_submission_per_student():
    found = discover(EXAMPLE / "submissions", github_classroom_prefix="attention-assignment")
    layout = {s.id: s.layout for s in found}
    assert layout == {
        "1001": "canvas", "1002": "canvas", "1003": "canvas", "1004": "canvas", "1005": "canvas",
        "1006": "canvas", "1007": "canvas", "1008": "canvas", "1009": "canvas",
        "2001": "moodle", "2002": "moodle",
        "bliskov": "github-classroom", "mhamilton": "github-classroom",
        "torvalds": "github-classroom"}
    by_id = {s.id: s for s in found}
    assert by_id["1003"].late and not by_id["1001"].late
    assert by_id["1003"].sources[0].staged_name == "attention.py"  # Canvas' -1 suffix removed
    assert by_id["2001"].name == "Katherine Johnson"
    assert len(by_id["2001"].sources) == 1                         # onlinetext_ ignored
    assert by_id["torvalds"].repository == "attention-assignment-torvalds"


def test_canvas_moodle_github_and_plain_entries(tmp_path):
    touch(tmp_path / "smithjohn_42_900_attention.py")
    touch(tmp_path / "smithjohn_42_901_helpers.py")                 # same student, two files
    touch(tmp_path / "doejane_late_43_902_attention.py")
    touch(tmp_path / "Ana María López_77_assignsubmission_file_attention.py")  # Moodle, flat
    touch(tmp_path / "hw1-octocat" / "attention.py")
    touch(tmp_path / "hw1-hubot" / "attention.py")
    touch(tmp_path / "loose folder" / "attention.py")
    touch(tmp_path / "alone.py")
    touch(tmp_path / "notes.txt")                                  # not code: ignored
    touch(tmp_path / "__MACOSX" / "._alone.py")                    # debris: ignored
    touch(tmp_path / ".hidden.py")
    found = {s.id: s for s in discover(tmp_path)}
    assert sorted(found) == ["42", "43", "77", "alone", "hubot", "loose-folder", "octocat"]
    assert [s.staged_name for s in found["42"].sources] == ["attention.py", "helpers.py"]
    assert found["43"].late
    assert found["77"].layout == "moodle" and found["77"].name == "Ana María López"
    assert found["octocat"].layout == "github-classroom"           # prefix hw1- found
    assert found["loose-folder"].layout == "folder"


def test_the_output_folder_is_not_a_submission(tmp_path):
    touch(tmp_path / "alice.py")
    touch(tmp_path / "grading" / "staged" / "alice" / "alice.py")
    assert [s.id for s in discover(tmp_path, exclude=(tmp_path / "grading",))] == ["alice"]


def test_ids_are_file_name_safe_and_unique(tmp_path):
    assert safe_id("../../etc/passwd") == "etc-passwd"
    assert safe_id("  ") == "submission"
    touch(tmp_path / "a b.py")
    touch(tmp_path / "a-b" / "x.py")
    assert sorted(s.id for s in discover(tmp_path)) == ["a-b", "a-b-2"]


def test_zip_extraction_flattens_one_folder_and_skips_debris(tmp_path):
    archive = make_zip(tmp_path / "s.zip", {"hw/attention.py": "A = 1\n", "hw/pkg/util.py": "",
                                            "__MACOSX/hw/._attention.py": "junk",
                                            "hw/.DS_Store": "junk"})
    written = extract_zip(archive, tmp_path / "out")
    assert sorted(p.as_posix() for p in written) == ["attention.py", "pkg/util.py"]
    assert (tmp_path / "out" / "attention.py").read_text() == "A = 1\n"


@pytest.mark.parametrize("members,modes,message", [
    ({"../evil.py": "x"}, None, "climbs out"),
    ({"/etc/evil.py": "x"}, None, "absolute path"),
    ({"C:/evil.py": "x"}, None, "absolute path"),
    ({"link.py": "/etc/passwd"}, {"link.py": 0o120777}, "symbolic link"),
    ({"fifo": ""}, {"fifo": 0o010644}, "not a plain file"),
])
def test_zip_extraction_refuses_what_would_escape(tmp_path, members, modes, message):
    archive = make_zip(tmp_path / "s.zip", members, modes=modes)
    with pytest.raises(ArchiveError, match=message):
        extract_zip(archive, tmp_path / "out")
    assert not (tmp_path / "evil.py").exists()


def test_zip_extraction_counts_the_bytes_it_actually_inflates(tmp_path):
    bomb = make_zip(tmp_path / "bomb.zip", {"zeros.py": b"0" * (3 * 2**20)})
    assert bomb.stat().st_size < 2**16
    with pytest.raises(ArchiveError, match="expands past"):
        extract_zip(bomb, tmp_path / "out", ArchiveLimits(max_member_bytes=2**20))
    many = make_zip(tmp_path / "many.zip", {f"f{i}.py": "" for i in range(5)})
    with pytest.raises(ArchiveError, match="5 members"):
        extract_zip(many, tmp_path / "out2", ArchiveLimits(max_members=4))
    (tmp_path / "junk.zip").write_bytes(b"PK\x03\x04 not really")
    with pytest.raises(ArchiveError, match="not a readable zip"):
        extract_zip(tmp_path / "junk.zip", tmp_path / "out3")


def notebook(*cells: tuple[str, str]) -> str:
    return json.dumps({"cells": [{"cell_type": kind, "source": source, "metadata": {}}
                                 for kind, source in cells], "nbformat": 4, "nbformat_minor": 5})


TRAINING = notebook(
    ("markdown", "# Attention"),
    ("code", "!pip install einops\n%matplotlib inline\nimport math\nimport torch\nD = 64\nS = 1 / 8\n"),
    ("code", "@torch.no_grad()\ndef helper(x):\n    return x\n\nclass Attn(torch.nn.Module):\n    pass\n"),
    ("code", "model = Attn()\nfor step in range(10**9):\n    train(model)\n"),
    ("code", "x = 1; open('/tmp/pwned', 'w')\n"),
    ("code", "%%bash\nrm -rf /\n"),
    ("code", "def broken(:\n"),
)


def test_notebooks_keep_only_definitions_by_default():
    converted = convert(TRAINING, name="hw.ipynb")
    source = converted.source
    compile(source, "hw.py", "exec")
    assert "import torch" in source and "class Attn" in source and "@torch.no_grad()" in source
    assert "D = 64" in source and "S = 1 / 8" in source
    assert "train(" not in source and "pip" not in source and "rm -rf" not in source
    assert "open(" not in source and "x = 1" in source  # a call sharing a line is still dropped
    assert converted.syntax_errors == ["cell 7, line 1: invalid syntax"]
    assert any("were not run" in note for note in converted.notes)


def test_run_all_cells_keeps_everything_but_shell_and_magics():
    source = convert(TRAINING, run_all_cells=True).source
    assert "train(model)" in source and "open('/tmp/pwned'" in source
    assert "pip install" not in source and "rm -rf" not in source


@pytest.mark.parametrize("text", ["{not json", json.dumps({"cells": "nope"}), "[]"])
def test_an_unreadable_notebook_is_an_error_not_a_crash(text):
    with pytest.raises(NotebookError):
        convert(text, name="bad.ipynb")


def test_staging_hashes_the_files_converts_notebooks_and_never_follows_links(tmp_path):
    source = tmp_path / "download" / "student"
    touch(source / "attention.py", "class A: pass\n")
    touch(source / "sub" / "helpers.py")
    (source / "My Notebook (2).ipynb").write_text(TRAINING)
    secret = touch(tmp_path / "secret.txt", "password")
    os.symlink(secret, source / "link.txt")
    os.symlink(tmp_path, source / "linked-folder")
    (submission,) = discover(tmp_path / "download")
    staged = stage(submission, tmp_path / "staged")
    assert staged.problem is None
    assert staged.files == ["My_Notebook_2.py", "attention.py", "sub/helpers.py"]
    assert staged.syntax_errors and staged.notes
    again = stage(submission, tmp_path / "staged-again")
    assert staged.hash == again.hash == tree_hash(tmp_path / "staged")
    touch(source / "attention.py", "class A: pass  # changed\n")
    assert stage(submission, tmp_path / "staged-3").hash != staged.hash


def test_staging_problems_are_statuses(tmp_path):
    touch(tmp_path / "d" / "a_1_2_attention.zip", "not a zip")
    touch(tmp_path / "d" / "b_3_4_notes.ipynb", "{")
    touch(tmp_path / "e" / "c" / "README.md", "no code here")
    (bad_zip, bad_notebook) = discover(tmp_path / "d")
    assert stage(bad_zip, tmp_path / "s1").problem is RunStatus.UNREADABLE
    staged = stage(bad_notebook, tmp_path / "s2")
    assert staged.problem is RunStatus.UNREADABLE and "not a readable notebook" in staged.message
    (no_code,) = discover(tmp_path / "e")
    assert stage(no_code, tmp_path / "s3").problem is RunStatus.NO_CODE


def rubric_for(tmp_path, *classes: str):
    text = "".join(f'[[targets]]\nclass = "{name}"\n[[targets.items]]\ncheck = "gate"\npoints = 1\n'
                   for name in classes)
    path = tmp_path / "r.toml"
    path.write_text(text)
    return load(path)


def test_locating_classes_in_files_packages_and_near_misses(tmp_path):
    root = tmp_path / "s"
    touch(root / "pkg" / "__init__.py", "from .layers import MultiHeadAttention\n")
    touch(root / "pkg" / "layers.py", "class MultiHeadAttention: pass\n")
    touch(root / "tests" / "test_it.py", "class MultiHeadAttention: pass\n")
    touch(root / "causal.py", "class CausalSelfAttenton: pass\nclass Helper: pass\n")
    touch(root / "broken.py", "def f(:\n")
    rubric = rubric_for(tmp_path, "MultiHeadAttention", "CausalSelfAttention", "Missing")
    scans = scan(root)
    mha, causal, _ = (locate(t, scans, root) for t in rubric.targets)
    assert mha == Location("pkg/layers.py", "MultiHeadAttention", "pkg.layers",
                           "pkg.layers:MultiHeadAttention", (".",), "class")
    assert isinstance(causal, TargetOutcome) and causal.status is RunStatus.SYNTAX_ERROR
    assert causal.near_misses == ["CausalSelfAttenton"]
    assert "broken.py, line 1" in causal.message
    (root / "broken.py").unlink()
    causal = locate(rubric.targets[1], scan(root), root)
    assert causal.status is RunStatus.NOT_FOUND
    assert causal.message == "no class CausalSelfAttention; did you mean CausalSelfAttenton?"
    assert locate(rubric.targets[2], scan(root), root).near_misses == []


def test_a_plain_file_is_loaded_from_its_path_with_its_folder_importable(tmp_path):
    root = tmp_path / "s"
    touch(root / "src" / "attention.py", "from helpers import f\nclass MHA: pass\n")
    touch(root / "src" / "helpers.py", "def f(): pass\n")
    (target,) = rubric_for(tmp_path, "MHA").targets
    location = locate(target, scan(root), root)
    assert location.spec == "src/attention.py::MHA" and location.paths == ("src", ".")


def test_near_misses_prefer_the_same_letters_and_skip_weak_or_taken_names():
    names = ["MultiheadAttention", "MultiHeadSelfAttention", "CausalSelfAttention", "Helper"]
    assert near_misses("MultiHeadAttention", names) == ["MultiheadAttention", "MultiHeadSelfAttention"]
    assert near_misses("MultiHeadAttention", names, exclude=("MultiheadAttention",)) == [
        "MultiHeadSelfAttention"]
    assert near_misses("Transformer", names) == []


def test_a_class_bound_only_by_an_import_is_found_last_and_flagged(tmp_path):
    root = tmp_path / "s"
    touch(root / "attention.py", textwrap.dedent("""
        from torch.nn import MultiheadAttention as MultiHeadAttention
    """))
    (target,) = rubric_for(tmp_path, "MultiHeadAttention").targets
    location = locate(target, scan(root), root)
    assert location.how == "import"


def test_zipped_download_of_the_whole_class_is_accepted(tmp_path):
    from conformance.grading.pipeline import GradingInputError, find_submissions

    archive = io.BytesIO()
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("smithjohn_1_2_attention.py", "class A: pass\n")
        z.writestr("doejane_3_4_attention.py", "class A: pass\n")
    (tmp_path / "download.zip").write_bytes(archive.getvalue())
    rubric = rubric_for(tmp_path, "A")
    found = find_submissions(tmp_path / "download.zip", rubric, tmp_path / "out")
    assert [s.id for s in found] == ["1", "3"]
    with pytest.raises(GradingInputError, match="no such folder"):
        find_submissions(tmp_path / "nope", rubric, tmp_path / "out")


def test_the_grade_command_extracts_a_downloaded_zip_once(tmp_path, monkeypatch, capsys):
    """The command finds the submissions once (bad input said before any work) and grades
    those: a class's zip is extracted one time, not once to check and again to grade."""
    import conformance.grading.pipeline as pipeline
    from conformance.frontends.cli import main

    archive = io.BytesIO()
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("smithjohn_1_2_attention.py", "class A: pass\n")
    (tmp_path / "download.zip").write_bytes(archive.getvalue())
    rubric_for(tmp_path, "A")
    extracted = []
    real = pipeline.extract_zip

    def counting(*args, **kwargs):
        extracted.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(pipeline, "extract_zip", counting)
    main(["grade", str(tmp_path / "download.zip"), "--rubric", str(tmp_path / "r.toml"),
          "--out", str(tmp_path / "out"), "--no-sandbox"])
    assert extracted == [tmp_path / "download.zip"], capsys.readouterr()
    assert "graded 1" in capsys.readouterr().out
