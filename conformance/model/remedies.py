"""What a user can declare to settle a finding that behaviour can't: a remedy is data (which
declaration, which value, what it means), and each front end says it in its own words: a flag
for the command line, a declaration for pytest and the Python API, nothing for a student
(whose interface the assignment prescribes). Nothing below the front ends spells a flag."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


@dataclass(frozen=True)
class Option:
    """Declare ``declaration`` (its name in :mod:`conformance.model.declaration_specs`) as
    ``value`` (None: a value the user chooses, said by the declaration's grammar): what that
    ``means`` for the finding."""

    declaration: str
    value: str | None
    means: str


@dataclass(frozen=True)
class Remedy:
    """The declarations that settle a finding, each way it can be settled."""

    options: tuple[Option, ...]

    @classmethod
    def to(cls, declaration: str, value: str | None, means: str) -> Remedy:
        """The remedy of one option: declare ``declaration`` as ``value`` to ``means``."""
        return cls((Option(declaration, value, means),))

    def to_dict(self) -> dict:
        return {"options": [vars(option) for option in self.options]}

    @classmethod
    def from_dict(cls, data: dict) -> Remedy:
        return cls(tuple(Option(**option) for option in data.get("options", [])))


class Topic(str, Enum):
    """What a note says, where it says how the implementation is called: the words a student
    is shown of how their class was built and called (their interface is the assignment's);
    a note without a topic is the suite's own finding, for the teacher."""

    CALL = "call"
    """The forward's call: its inputs and its mask argument."""
    CONSTRUCTOR = "constructor"
    """How it is built: which argument sets the width, the heads, a config."""
    MASK = "mask"
    """The mask argument and how it is read."""


@dataclass(frozen=True)
class Note:
    """One thing inference found rather than was told, in words, the declaration that states
    it otherwise (None where none would change it), and its topic where it says how the
    implementation is called."""

    text: str
    remedy: Remedy | None = None
    topic: Topic | None = None
    plain: str | None = None
    """The note in the words of someone who wrote the code, where ``text`` says how it was
    found (a probe, what was passed over): what a student is shown."""

    def to_dict(self) -> dict:
        return {"text": self.text,
                "remedy": self.remedy.to_dict() if self.remedy is not None else None,
                "topic": self.topic.value if self.topic is not None else None,
                "plain": self.plain}


def as_notes(notes: tuple[str | Note, ...] | list[str | Note]) -> tuple[Note, ...]:
    """``notes`` as Notes: a plain string is a note no declaration settles."""
    return tuple(note if isinstance(note, Note) else Note(note) for note in notes)


def remedy_of(error: BaseException) -> Remedy | None:
    """The remedy an error carries, or the first its causes carry (an InferenceError inside the
    ResolveError that reports it); None where none does."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        remedy = getattr(current, "remedy", None)
        if isinstance(remedy, Remedy):
            return remedy
        current = current.__cause__
    return None


def on(topics: tuple[Topic, ...], notes: tuple[Note, ...] | list[Note]) -> list[str]:
    """The plain words of the ``notes`` on any of ``topics``."""
    return [note.plain or note.text for note in notes if note.topic in topics]


def texts(notes: tuple[Note, ...] | list[Note]) -> list[str]:
    """The words of ``notes``, without what would state them otherwise (as a student reads
    them)."""
    return [note.text for note in notes]
