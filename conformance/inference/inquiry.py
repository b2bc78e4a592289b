"""What one inference knows as it goes (:class:`Inquiry`): every step of
:func:`~conformance.inference.infer.infer` is ``step(inquiry)``, reading what earlier steps found
and adding what it finds."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from conformance.generation.constraints import Constraint
from conformance.inference.found import CapabilitiesFound
from conformance.inference.plan import Plan
from conformance.inference.weights.weight_roles import WeightOutcome
from conformance.model.declarations import Declarations
from conformance.model.forms import LogitScale
from conformance.model.remedies import Note
from conformance.model.spec import Config
from conformance.model.weights import WeightLayout
from conformance.subject.in_process import InProcessSubject, ModuleInstance


@dataclass
class Inquiry:
    """One class's inference under way: what it was given (``plan``, ``label``, ``declared``),
    what the steps have found (``capabilities``; the configurations it builds for, the probes'
    sizes, the probe instance, the weights), and what they said (``notes``, in order)."""

    plan: Plan
    label: str
    declared: Declarations
    capabilities: CapabilitiesFound
    notes: list[str | Note] = field(default_factory=list)
    constraint: Constraint | None = None
    """The configurations it builds (and runs) for; None where every one does."""
    heads: int = 1
    head_dim: int = 4
    """The probes' sizes (:func:`~conformance.inference.construction.build_and_call.probe_sizes`)."""
    config: Config | None = None
    """The probes' configuration, ``heads`` of ``head_dim``."""
    probe: ModuleInstance | None = None
    """An instance built once the call is settled, which the steps that only call it share."""
    layout: WeightLayout | None = None
    outcome: WeightOutcome | None = None
    """The weight step's layout and outcome."""
    logit_scale: LogitScale | None = None
    """The logit scale the layer's design sets, where it is not 1/sqrt(w) (measured at its core:
    :mod:`conformance.inference.steps.scale`)."""

    def build(self, config: Config | None = None, layout: WeightLayout | None = None,
              **changes: object) -> ModuleInstance:
        """The module as found so far (``changes`` over the capabilities), built for ``config``
        (the probes' by default), reading its weights through ``layout`` where one is given."""
        implementation = self.plan.implementation(self.label, **self.capabilities.given(**changes))
        if layout is not None:
            implementation = replace(implementation, weight_layout=layout)
        return InProcessSubject(implementation).instantiate(config or self.config, seed=0)
