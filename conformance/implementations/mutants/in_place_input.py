"""Mutant: scales its query argument in place.

Bug: ``query.mul_(...)`` on the argument (to "save memory"): the caller's tensor changes.
Symptom: the inputs differ after the call.
Caught by: ``contract``.
"""

from __future__ import annotations

from conformance.implementations.mutants.textbook import TextbookAttention, declare

CATCHES = "contract"


class InPlaceInput(TextbookAttention):
    def prepare(self, query, key, value):
        query.mul_(0.5)
        return query, key, value


IMPLEMENTATION = declare("mutant-in-place-input", InPlaceInput,
                         description="scales its query argument in place")
