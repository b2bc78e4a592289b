"""How a student's class was built and called, in the words of the course: its constructor, its
forward's arguments, the mask as the course passes it, whether it is causal.

These lines are what a student is shown under "How your class was called"; everything else
inference found (the weights' layout, the dtypes assumed, the probes behind each finding) is the
teacher's, in the class report and the stored results. They are read from the notes inference
tagged with a topic (:class:`~conformance.model.remedies.Topic`) and from the capabilities it
settled, never by filtering sentences.
"""

from __future__ import annotations

from conformance.model.remedies import Topic, on
from conformance.subject.boundary import Subject

CAUSAL_WORDS = {"never": "every query sees every key (no causal mask)",
                "always": "causal: each query sees itself and the earlier keys only"}
"""How each causality reads to a student; ``optional`` names its argument."""


def called(subject: Subject) -> list[str]:
    """The lines that tell a student how ``subject`` was built and called."""
    lines = on((Topic.CONSTRUCTOR, Topic.CALL, Topic.MASK), subject.notes)
    causality = subject.capabilities.causality
    lines.append(CAUSAL_WORDS.get(causality.kind)
                 or f"causal when called with {causality.argument}=True, else not")
    return lines


def mask_spec(subject: Subject) -> str | None:
    """The mask convention ``subject`` was called with, as a declaration states it (None: no
    mask), for the feedback to show an example's mask as the course passes it."""
    mask = subject.capabilities.mask
    return None if mask is None else mask.spec()
