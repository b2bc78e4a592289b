"""What inference has found about an implementation's capabilities so far.

Each step of :func:`~conformance.inference.infer.infer` reads what earlier steps found
(``found.caps.causality.kind``: typed, as :class:`~conformance.model.spec.Capabilities` declares it) and
sets what it finds itself (``found.set(window="config")``: a field name that is not one of the
capabilities is an error, not a silent key; a group's fields are set as a mapping of them,
``found.set(causality={"kind": "always"})``, the group's other fields left as found).
:meth:`CapabilitiesFound.given` is what the steps set, and only that: :meth:`Plan.implementation`
lays it over its own defaults.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from conformance.model.capability_groups import laid_over
from conformance.model.spec import Capabilities


class CapabilitiesFound:
    """The capabilities found so far, and which of them the steps set."""

    def __init__(self, **initial: object) -> None:
        self.caps = Capabilities()
        self.unprobed: set[str] = set()
        """Capabilities a step could not probe (``causal``: the unmasked call fails): what they
        read is a default, which later steps must not state as found."""
        self._names: dict[str, None] = {}
        self.set(**initial)

    def set(self, **values: object) -> None:
        """Record what a step found (Capabilities' field names; a group's, a mapping of some of
        its fields)."""
        groups = {name: getattr(self.caps, name) for name, value in values.items()
                  if isinstance(value, Mapping)}
        self.caps = replace(self.caps, **laid_over(groups, values))
        for name, value in values.items():
            self._names.update(dict.fromkeys([f"{name}.{field}" for field in value]
                                             if isinstance(value, Mapping) else [name]))

    def doubt(self, **doubts: str) -> None:
        """Record what a step could not settle (Doubts' field names)."""
        self.set(doubts=replace(self.caps.doubts, **doubts))

    def given(self, **changes: object) -> dict[str, object]:
        """The fields the steps set (with ``changes`` over them), as Plan.implementation takes
        them: a group's as a mapping of the fields set."""
        given: dict[str, object] = {}
        for name in self._names:
            group, _, field = name.partition(".")
            if field:
                given.setdefault(group, {})[field] = getattr(getattr(self.caps, group), field)
            else:
                given[name] = getattr(self.caps, name)
        for name, value in changes.items():
            under = given.get(name)
            # A group's fields stay a mapping, laid over Plan's defaults field by field.
            if not isinstance(value, Mapping):
                given[name] = value
            elif under is None or isinstance(under, Mapping):
                given[name] = {**(under or {}), **value}
            else:
                given[name] = replace(under, **value)
        return given

    def fork(self) -> CapabilitiesFound:
        """A copy a tentative step may set things on, adopted only if the step holds."""
        copy = CapabilitiesFound()
        copy.caps, copy._names, copy.unprobed = self.caps, dict(self._names), set(self.unprobed)
        return copy

    def adopt(self, other: CapabilitiesFound) -> None:
        """What ``other`` (a fork of this one) has found, as this one's."""
        self.caps, self._names, self.unprobed = other.caps, dict(other._names), set(other.unprobed)
