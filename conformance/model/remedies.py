"""What a user can declare to settle a finding that behaviour can't: a remedy is data (which
declaration, which value, what it means), and each front end says it in its own words: a flag
for the command line, ``--attention-declare NAME=VALUE`` for pytest, nothing for a student
(whose interface the assignment prescribes)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Option:
    """Declare ``declaration`` (its name in :mod:`conformance.model.declaration_specs`) as
    ``value``: what that ``means`` for the finding."""

    declaration: str
    value: str
    means: str


@dataclass(frozen=True)
class Remedy:
    """The declarations that settle a finding, each way it can be settled."""

    options: tuple[Option, ...]

    def to_dict(self) -> dict:
        return {"options": [vars(option) for option in self.options]}

    @classmethod
    def from_dict(cls, data: dict) -> Remedy:
        return cls(tuple(Option(**option) for option in data.get("options", [])))
