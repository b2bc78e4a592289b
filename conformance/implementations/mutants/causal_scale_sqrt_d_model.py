"""Mutant: a causal attention that divides the logits by sqrt(d_model).

Bug: ``/ math.sqrt(d_model)`` instead of ``sqrt(head_dim)``, in a decoder's causal layer (the
same mistake as ``mutant-scale-sqrt-d-model``, where an assignment of causal attention, with or
without a KV cache, grades it: a rubric's self-test pairs mutants with targets of their
causality). Symptom: the fitted logit scale is 1/sqrt(d_model).
Caught by: ``scale``.
"""

from __future__ import annotations

from conformance.implementations.mutants.scale_sqrt_d_model import ScaleSqrtDModel
from conformance.implementations.mutants.textbook import declare

CATCHES = "scale"


class CausalScaleSqrtDModel(ScaleSqrtDModel):
    """The class of its own a user would check (``FILE::CausalScaleSqrtDModel``)."""


IMPLEMENTATION = declare("mutant-causal-scale-sqrt-d-model", CausalScaleSqrtDModel, causal=True,
                         description="causal, and divides the logits by sqrt(d_model)")
