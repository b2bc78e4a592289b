"""What to declare, in the language of the interface in use.

Below the front ends a remedy is data (:mod:`conformance.model.remedies`): which declaration,
which value, what it means. Here it is said: a flag on the command line (``--kv-grouping
tiled``), an option under pytest (``--attention-declare kv-grouping=tiled``), an argument in a
test file (``declare={"kv-grouping": "tiled"}``). A student is told none of it (their interface
is the assignment's): grading renders a note's text alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from conformance.model.declaration_specs import BY_NAME, Form
from conformance.model.remedies import Note, Remedy, remedy_of

Interface = Literal["cli", "pytest", "python"]


def declaration_words(declaration: str, value: str | None, interface: Interface) -> str:
    """One declaration as ``interface`` writes it; a value left to the user (None) is its
    grammar (``--mask KIND:LAYOUT[+causal][@ARG]``)."""
    spec = BY_NAME[declaration]
    value = value if value is not None else spec.grammar.replace(" | ", "|")
    if interface == "cli":
        return spec.flag if spec.form is Form.SWITCH else f"{spec.flag} {value}"
    if interface == "pytest":
        return f"--attention-declare {spec.key}={value}"
    return f'declare={{"{spec.key}": "{value}"}}'


def remedy_words(remedy: Remedy, interface: Interface) -> str:
    """``remedy`` as ``interface`` says a declaration: ``declare --kv-grouping tiled to accept
    it, or --kv-grouping interleaved to hold it to HuggingFace's`` on the command line, ``add
    --attention-declare ...`` under pytest, ``pass declare={...}`` in Python."""
    said = [f"{declaration_words(o.declaration, o.value, interface)} to {o.means}"
            for o in remedy.options]
    return _VERB[interface] + ", or ".join(said)


_VERB = {"cli": "declare ", "pytest": "add ", "python": "pass "}


def note_words(note: Note, interface: Interface) -> str:
    """An inferred note, with what would state it otherwise said for ``interface``."""
    if note.remedy is None:
        return note.text
    return f"{note.text}; {remedy_words(note.remedy, interface)}"


def notes_words(notes: Sequence[Note], interface: Interface) -> list[str]:
    return [note_words(note, interface) for note in notes]


def error_words(error: BaseException, interface: Interface) -> str:
    """An error's one line, with the declaration that settles it (where it carries one)."""
    remedy = remedy_of(error)
    return str(error) if remedy is None else f"{error}: {remedy_words(remedy, interface)}"
