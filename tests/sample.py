"""The fast tier's sample of the bundled catalogue, chosen by rule, not by hand.

``make test`` runs the whole-catalogue proofs (the verdict matrix, one process against two,
inference alone against the registrations) on the implementations :func:`sample` picks;
``make test-all`` runs them on every one. The rule: every *form* the catalogue has is in the
sample at least once, where an implementation's forms are its family (the module its factory
lives in), its call form, each capability it declares (a field of ``Capabilities`` off its
default), and each check its bug is caught by (expected failures and warnings: a mutant kind).
Chosen greedily (the implementation that adds most forms not yet in, ties in catalogue order), so
a new family, declaration kind, call form or mutant kind is sampled the day it is bundled.
"""

from __future__ import annotations

from dataclasses import fields
from functools import cache

from conformance.implementations import bundled
from conformance.model.capability_groups import GROUPS
from conformance.model.spec import Capabilities, Implementation

Form = tuple[str, str]

UNDECLARED = ("doubts", "notes")
"""Capabilities' fields that are findings about a module, not forms it declares."""


def _declared(caps: Capabilities) -> dict[str, object]:
    """Capabilities' fields, each group's as its own (``cache.style``): a form each."""
    values: dict[str, object] = {}
    for f in fields(Capabilities):
        value = getattr(caps, f.name)
        if f.name in GROUPS:
            values.update({f"{f.name}.{g.name}": getattr(value, g.name) for g in fields(value)})
        else:
            values[f.name] = value
    return values


def forms(implementation: Implementation) -> frozenset[Form]:
    """The forms ``implementation`` stands for (see the module docstring)."""
    caps, default = implementation.capabilities, Capabilities()
    found = {("family", getattr(implementation.factory, "__module__", "?")),
             ("call", caps.call)}
    found |= {("declares", name) for name, value in _declared(caps).items()
              if name not in UNDECLARED and value != _declared(default)[name]}
    found |= {("caught by", check) for check in implementation.expected_failures}
    found |= {("warned by", check) for check in implementation.expected_warnings}
    return frozenset(found)


def sample(implementations: list[Implementation]) -> tuple[str, ...]:
    """The names of a smallest-first greedy cover of every form ``implementations`` have."""
    left = set().union(*(forms(i) for i in implementations))
    chosen: list[str] = []
    while left:
        best = max(implementations,
                   key=lambda i: (len(forms(i) & left), -implementations.index(i)))
        chosen.append(best.name)
        left -= forms(best)
    return tuple(chosen)


@cache
def bundled_sample() -> frozenset[str]:
    """The sample of the bundled catalogue (computed once per process)."""
    return frozenset(sample(bundled()))
