"""A correct solution written another way: the reference with opaque attribute names, and the
self-test's warning when a rubric costs such a solution points."""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

from conformance.grading import selftest
from conformance.grading.run.variants import renamed
from conformance.grading.score.rubric_file import load

EXAMPLE = Path(__file__).parents[1] / "examples" / "attention-assignment"

SOURCE = '''
from torch import nn


class Base(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.q_proj, self.k_proj = nn.Linear(d, d), nn.Linear(d, d)
        self.scale: float = d ** -0.5
        self.register_buffer("bias", None)
        self.training = False
        self.seen = getattr(self, "scale")

    def forward(self, x):
        return self.q_proj(x) @ self.k_proj(x).T * self.scale


class Child(Base):
    def extra(self):
        return self.k_proj


def peek(model):
    return model.seen
'''


def test_only_attributes_read_through_self_in_their_own_class_are_renamed(tmp_path):
    path = tmp_path / "attention.py"
    path.write_text(textwrap.dedent(SOURCE))
    variant = renamed(path, tmp_path / "variant")
    # k_proj is read by a subclass, scale named in a string, seen read through another object,
    # training is nn.Module's own: they keep their names.
    assert variant.names == {"q_proj": "layer0"}
    tree = ast.parse(variant.path.read_text())
    attributes = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    assert "layer0" in attributes and "q_proj" not in attributes
    assert {"k_proj", "scale", "seen", "training"} <= attributes


def test_the_self_test_warns_when_names_cost_a_correct_solution_points(tmp_path):
    """A rubric that declares the weights by name ties the points to those names."""
    original = (EXAMPLE / "rubric.toml").read_text()
    declared = 'output-projection = "applied", scale = "sqrt" }'
    assert declared in original  # the interface the names are added to
    text = original.replace(
        'reference = "reference/attention.py"',
        f'reference = "{EXAMPLE / "reference" / "attention.py"}"').replace(
        declared, declared[:-2] + ', weights = "q_proj,k_proj,v_proj,out_proj" }')
    path = tmp_path / "rubric.toml"
    path.write_text(text)
    result = selftest.run(load(path), mutants=[])
    assert result.reference_problems == [] and result.ok
    assert result.warnings, selftest.render(result)
    assert all(warning.startswith("the reference with its attributes renamed")
               for warning in result.warnings)
    assert "MultiHeadAttention." in result.warnings[0]
    assert "WARNING: a correct solution written another way loses points" in \
        selftest.render(result)
