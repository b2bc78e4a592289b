"""Every path a forward offers: its switches (a bool: ``need_weights``, ``output_attentions``,
``return_attention``, a kernel's ``use_flash``; a ``Literal`` or Enum of choices: ``attn_impl``),
each called with each value the suite's calls do not give it.

A switch whose two values claim the same attention (its name says it returns the weights beside
the output, or runs another kernel: :data:`~conformance.inference.names.convention.
SAME_ATTENTION_SWITCHES`), and every path declared, is held to the default call's output by
``path_agreement``, so a causal mask the weights-returning path drops fails there. A switch of
another name that changes the output is a setting of its own: said, not held to the default's,
with the declaration that would hold it. A value that raises is no path of the module's.
"""

from __future__ import annotations

from dataclasses import replace
from enum import Enum

import torch

from conformance.generation.cases import own_queries
from conformance.inference.inquiry import Inquiry
from conformance.inference.names.convention import SAME_ATTENTION_CHOICES, SAME_ATTENTION_SWITCHES
from conformance.inference.observing.probing import probe_case
from conformance.inference.plan import declarations_read
from conformance.model.remedies import Note, Remedy
from conformance.numerics.tolerance import abs_error, reordering_tolerance
from conformance.subject.boundary import ImplementationError


def path_form(inquiry: Inquiry) -> None:
    """The paths ``path_agreement`` holds to the default call: those declared, and the switches
    that claim the same attention and run; each said."""
    plan, capabilities, notes = inquiry.plan, inquiry.capabilities, inquiry.notes
    with declarations_read():
        declared = inquiry.declared.path_list()
    paths = list(declared)
    if declared:
        notes.append("paths " + ", ".join(name for name, _ in declared)
                     + ": held to the default call's output (declared)")
    named = {option for _, options in declared for option, _ in options}
    switches = [(name, other) for name, _, others in plan.convention.switches
                if name not in named for other in others]
    if not switches:
        if paths:
            capabilities.set(paths=(*capabilities.caps.paths, *paths))
        return
    case = own_queries(probe_case(inquiry.heads, inquiry.head_dim, kept=None), capabilities.caps)
    inputs = case.inputs(plan.convention.call)
    try:
        base = inquiry.probe.forward(inputs)
    except ImplementationError:
        return  # the basic call fails: the gate's to report
    for name, value in switches:
        options = ((name, value),)
        path = f"{name}={value.value if isinstance(value, Enum) else value}"
        try:
            other = inquiry.probe.forward(replace(inputs, options=options))
        except ImplementationError as error:
            notes.append(f"{path} raises ({error}): no path of its own, not checked")
            continue
        if not isinstance(other, torch.Tensor) or other.shape != base.shape:
            notes.append(f"{path} returns no output of the default call's shape: not checked as "
                         "a path")
            continue
        if name in SAME_ATTENTION_SWITCHES or name in SAME_ATTENTION_CHOICES:
            paths.append((path, options))
            notes.append(f"{path}: another path to the same attention (its first output), held "
                         "to the default call's by path_agreement (probed: it runs)")
        elif float(abs_error(other, base, nan_equal=True).max()) > reordering_tolerance(
                base.dtype, base):
            notes.append(Note(f"{path} changes its output: a setting of its own, not held to the "
                              "default call's", Remedy.to("paths", path,
                                                          "hold it to the same attention")))
    if paths:
        capabilities.set(paths=(*capabilities.caps.paths, *paths))
