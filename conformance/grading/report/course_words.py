"""The suite's evidence in a course's words: an example as the student's class received it (its
sizes, and its mask as the course passes it: ``mask = [[[1, 0]]]`` for the Annotated
Transformer's (B, 1, Lk), ``valid_lens = [1]`` for d2l's), and the rubric's labels where a
message points at another check."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from conformance.errors import ConformanceError
from conformance.generation.cases import DTYPES as CASE_DTYPES
from conformance.generation.cases import Case
from conformance.grading.report.student_text import for_student
from conformance.model.declarations import Declarations
from conformance.subject.masks import encode_mask

if TYPE_CHECKING:
    from conformance.grading.score.scoring import TargetScore


@dataclass(frozen=True)
class Wording:
    """How one student's class is spoken of: their ``files`` (as submitted, for the paths in
    messages), the ``mask`` convention their class was called with, and the rubric's ``labels``
    (check name -> the label of the item that holds it)."""

    files: tuple[str, ...] = ()
    mask: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, target: TargetScore | None, files: tuple[str, ...] = ()) -> Wording:
        """The wording of ``target``'s feedback."""
        if target is None:
            return cls(files)
        labels = {check: item.item.label for item in target.items for check in item.item.checks}
        mask = target.outcome.mask if target.outcome else None
        argument = target.target.declarations.mask_argument
        if mask is not None and argument:  # the forward's own name, not the suite's keyword
            mask = f"{mask.partition('@')[0]}@{argument}"
        return cls(files, mask, labels)

    def say(self, text: str) -> str:
        """``text`` as the student reads it: no grader's paths, the rubric's labels."""
        return labelled(for_student(text, self.files), self.labels)

    def example(self, counterexample: str) -> str:
        """A failing case as the student's class received it."""
        return for_student(example(counterexample, self.mask), self.files)


def example(counterexample: str, mask: str | None) -> str:
    """``counterexample`` (a ``Case(...)``) as the student's class received it, with its mask
    as ``mask`` (the convention it was called with, as declared) passes it; the text as it is
    where it is not a case."""
    try:
        case = Case.parse(counterexample)
    except ValueError:
        return counterexample
    lines = [f"batch {case.batch}, {case.q_len} quer{'y' if case.q_len == 1 else 'ies'} and "
             f"{case.kv_len} key{'' if case.kv_len == 1 else 's'} per sequence, "
             f"{case.num_heads} head{'' if case.num_heads == 1 else 's'} of width "
             f"{case.head_dim} (model width {case.d_model}), {case.dtype}"
             + (", causal" if case.causal else "")
             + (f", {case.kv_heads} key/value heads" if case.kv_heads else "")]
    keep = case.keep()
    if keep is None:
        lines.append("no mask" if mask is None else
                     f"{mask.partition('@')[2] or 'mask'} = None (every key visible)")
    elif mask is not None:
        lines.append(_mask(case, keep, mask))
    lines.append(f"inputs drawn at random with seed {case.seed}")
    return "\n".join(lines)


def _mask(case: Case, keep, spec: str) -> str:
    """``keep`` as ``spec`` passes it, as a Python literal (``mask = [[[1, 0]]]``)."""
    argument = spec.partition("@")[2] or "the mask"
    try:
        convention = Declarations(mask=spec).mask_convention(argument)
        tensor = encode_mask(keep, convention, num_heads=case.num_heads, q_len=case.q_len,
                             dtype=CASE_DTYPES[case.dtype], causal=case.causal)
    except (ConformanceError, ValueError, KeyError):
        return "masked keys: " + ", ".join(
            f"sequence {b} keeps {int(row.sum())} of {case.kv_len}" for b, row in enumerate(keep))
    return f"{argument} = {tensor.tolist()!r}"


_SEE = re.compile(r"\bsee (?P<check>[a-z_]+)\b")


def labelled(text: str, labels: Mapping[str, str]) -> str:
    """``text`` with each "see CHECK" that points at another check pointing at the rubric
    item that holds it (``labels``: check name -> item label), "see \\"padding mask\\""."""
    def label(match: re.Match) -> str:
        check = match.group("check")
        return f'see "{labels[check]}"' if check in labels else match.group(0)
    return _SEE.sub(label, text)
