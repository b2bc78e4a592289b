"""Mutant: output normalised by out.norm() without dim=.

Bug: ``x / x.norm()`` where ``x.norm(dim=-1, keepdim=True)`` was meant: one norm over the whole
batch, so a fully masked row's NaN reaches every batch element. Symptom: other batch elements
change (become NaN) when one element is fully masked.
Caught by: ``fully_masked``.
"""

from __future__ import annotations

from conformance.implementations.mutants.textbook import TextbookAttention, declare

CATCHES = "fully_masked"


class NormWithoutDim(TextbookAttention):
    def finish(self, x):
        return self.out_proj(x / x.norm() * x.shape[-1] ** 0.5)


IMPLEMENTATION = declare("mutant-norm-without-dim", NormWithoutDim,
                         description="output normalised by out.norm() without dim=")
