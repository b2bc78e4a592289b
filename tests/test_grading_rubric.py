"""The rubric: parsing, validation in one line, prerequisites, and the hashes resuming keys on."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from conformance.frontends.cli import main
from conformance.grading.score.rubric import GATE, RubricError, prerequisites
from conformance.grading.score.rubric_file import load

EXAMPLE = Path(__file__).parents[1] / "examples" / "attention-assignment"

BASE = """
[assignment]
name = "hw"
seed = 7
[[targets]]
class = "MultiHeadAttention"
aliases = ["MHA"]
interface = { call = "self", mask = "keep_bool:key_padding", width-arg = "d_model" }
[[targets.items]]
check = "contract"
points = 1
[[targets.items]]
check = "padding"
points = 2
requires = ["contract"]
[[targets.items]]
group = "numerics"
checks = ["reference", "scale"]
points = 3
[[targets.items]]
group = "robustness"
checks = ["autograd", "determinism", "batch_independence"]
points_each = 1
cap = 2
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "rubric.toml"
    path.write_text(textwrap.dedent(text))
    return path


def test_a_rubric_parses_into_targets_items_and_points(tmp_path):
    rubric = load(write(tmp_path, BASE))
    (target,) = rubric.targets
    assert target.names == ("MultiHeadAttention", "MHA")
    assert target.declarations.call == "self" and target.declarations.width_arg == "d_model"
    assert [item.key for item in target.items] == [
        "MultiHeadAttention.contract", "MultiHeadAttention.padding",
        "MultiHeadAttention.numerics", "MultiHeadAttention.robustness"]
    assert [item.max_points for item in target.items] == [1, 2, 3, 2]  # 3 x 1 capped at 2
    assert rubric.max_points == 8
    # The gate always runs first; checks come in catalogue order.
    assert target.checks == ("gate", "contract", "padding", "reference", "scale",
                             "batch_independence", "autograd", "determinism")
    assert prerequisites(target, "padding") == (GATE, "contract")
    assert prerequisites(target, "scale") == (GATE,)
    assert prerequisites(target, GATE) == ()
    assert rubric.profile == "quick" and rubric.seed == 7


def test_interface_conditions_parse(tmp_path):
    rubric = load(write(tmp_path, BASE.replace(
        'width-arg = "d_model"',
        'width-arg = "d_model", returns = "tensor", constructor = ["positional", "keyword"]')))
    (target,) = rubric.targets
    assert target.constructor_forms == ("positional", "keyword")
    assert target.declarations.constructor == "positional"  # the checks run on the first form
    assert target.declarations.returns == "tensor"
    plain = load(write(tmp_path, BASE)).targets[0]
    assert plain.constructor_forms == ("keyword",) and plain.declarations.constructor is None


def test_points_and_visibility_do_not_change_the_execution_key(tmp_path):
    first = load(write(tmp_path, BASE))
    repointed = load(write(tmp_path, BASE.replace("points = 2\nrequires",
                                                  "points = 5\nvisibility = \"hidden\"\nrequires")))
    reseeded = load(write(tmp_path, BASE.replace("seed = 7", "seed = 8")))
    assert repointed.execution_key() == first.execution_key()
    assert repointed.rubric_hash() != first.rubric_hash()
    assert reseeded.execution_key() != first.execution_key()


@pytest.mark.parametrize("change,message", [
    (("points = 1", "points = -1"), "points -1: must not be negative"),
    (('check = "contract"', 'check = "contrakt"'), "unknown check 'contrakt' (did you mean contract?)"),
    (('checks = ["reference", "scale"]', 'checks = ["reference", "scael"]'),
     "unknown check 'scael' (did you mean scale?)"),
    (("[[targets]]", "[[target]]"), "unknown key 'target' (did you mean targets?)"),
    (('requires = ["contract"]', 'requires = ["head_split"]'),
     "requires head_split, which is not an item of this target"),
    (("cap = 2", "cap = 2\nvisibility = \"sometimes\""), "visibility 'sometimes'"),
    (("cap = 2", "cap = 2\nvisibility = \"after_due_date\""), "gives no due"),
    (('seed = 7', 'seed = "seven"'), "seed 'seven': give an integer"),
    (('name = "hw"', 'name = "hw"\nprofile = "fast"'), "profile 'fast'"),
    (('mask = "keep_bool:key_padding"', 'mask = "keep:sideways"'), "mask 'keep:sideways'"),
    (('points_each = 1', 'points = 1\npoints_each = 1'), "give points (all-or-nothing) or points_each"),
    (('checks = ["autograd", "determinism", "batch_independence"]',
      'checks = ["autograd", "padding"]'), "check padding is scored twice"),
    (('class = "MultiHeadAttention"', 'class = "Multi Head"'), "class 'Multi Head'"),
    (('width-arg = "d_model"', 'width-arg = "d_model", returns = "array"'),
     "interface: returns 'array': use tensor, tuple"),
    (('width-arg = "d_model"', 'width-arg = "d_model", constructor = ["by name"]'),
     "interface constructor ['by name']: use \"keyword\", \"positional\""),
])
def test_a_bad_rubric_is_one_line_naming_the_place(tmp_path, change, message):
    old, new = change
    assert old in BASE
    path = write(tmp_path, BASE.replace(old, new, 1))
    with pytest.raises(RubricError) as caught:
        load(path)
    text = str(caught.value)
    assert message in text, text
    assert "\n" not in text and str(path) in text


def test_requires_in_a_circle_and_a_rubric_without_points_are_refused(tmp_path):
    circle = BASE.replace("[[targets.items]]\ncheck = \"contract\"\npoints = 1",
                          "[[targets.items]]\ncheck = \"contract\"\npoints = 1\nrequires = [\"padding\"]")
    with pytest.raises(RubricError, match="circle"):
        load(write(tmp_path, circle))
    nothing = """
    [[targets]]
    class = "A"
    [[targets.items]]
    check = "gate"
    points = 0
    """
    with pytest.raises(RubricError, match="awards no points"):
        load(write(tmp_path, nothing))


def test_the_cli_says_a_bad_rubric_or_folder_in_one_line_and_exits_2(tmp_path, capsys):
    bad_toml = write(tmp_path, "[assignment\nname = 1")
    good = EXAMPLE / "rubric.toml"
    empty = tmp_path / "empty"
    empty.mkdir()
    cases = [
        (["grade", str(tmp_path), "--rubric", str(bad_toml)], "not valid TOML"),
        (["grade", str(tmp_path / "nope"), "--rubric", str(good)], "no such folder"),
        (["grade", str(empty), "--rubric", str(good)], "no submissions in"),
        (["grade", str(empty), "--rubric", str(tmp_path / "missing.toml")], "no rubric file"),
    ]
    for argv, message in cases:
        # Bad input is reported whether or not the sandboxed worker exists: fake one.
        code = main(argv)
        out, err = capsys.readouterr()
        assert code == 2, (argv, out, err)
        assert out == "" and err.count("\n") == 1 and message in err, err
        assert "Traceback" not in err


def test_the_example_rubric_is_valid():
    rubric = load(EXAMPLE / "rubric.toml")
    assert [t.name for t in rubric.targets] == ["MultiHeadAttention", "CausalSelfAttention"]
    assert rubric.max_points == 12 and rubric.reference is not None and rubric.due is not None
