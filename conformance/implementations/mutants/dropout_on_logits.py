"""Mutant: dropout on the logits before the softmax.

Bug: dropout applied to the scores before the softmax (as seed 001's SelfAttentionThree does):
a dropped -inf becomes 0, so masked keys and future positions become visible in training, and
the expected output is biased. Symptom: train-mode outputs see masked keys.
Caught by: ``dropout``.
"""

from __future__ import annotations

from conformance.implementations.mutants.textbook import TextbookAttention, declare

CATCHES = "dropout"


class DropoutOnLogits(TextbookAttention):
    def attend(self, scores, mask):
        return self.softmax(self.drop(self.apply_mask(scores, mask)))


IMPLEMENTATION = declare("mutant-dropout-on-logits", DropoutOnLogits,
                         description="dropout on the logits before the softmax")
