"""Mutant: output projection defined but never applied.

Bug: ``finish`` returns the concatenated heads; ``out_proj`` exists (and is declared) but is not
used. Symptom: output matches the reference without its output projection.
Caught by: ``reference``.
"""

from __future__ import annotations

from conformance.implementations.mutants.textbook import TextbookAttention, declare

CATCHES = "reference"


class OutputProjectionSkipped(TextbookAttention):
    def finish(self, x):
        return x


IMPLEMENTATION = declare("mutant-output-projection-skipped", OutputProjectionSkipped,
                         description="output projection defined but never applied")
