"""What torch imports on a process's first backward pass, imported ahead of it.

``torch.autograd`` imports ``torch.fx.experimental.symbolic_shapes`` (and with it sympy) the
first time a backward pass is given a gradient tensor, as every gradient check does: about a
quarter of a second, paid by the first such check of every process. Where the module's backward
runs, a process that would otherwise wait imports it then instead: the zygote before it forks
workers, a warm server before it serves. (An isolated check's checker never needs it: its own
gradients are of a scalar, and it unravels indices in integers; importing it there while the
worker loads took a core the worker and its twin were using.)
"""

from __future__ import annotations

import importlib

MODULES = ("torch.fx.experimental.symbolic_shapes", "torch.nested._internal.nested_tensor")
"""What ``torch.autograd.backward(tensors, grad_tensors)`` imports on its first call
(torch 2.13's ``_make_grads``)."""


def import_ahead() -> None:
    """Import :data:`MODULES` now (a no-op once imported)."""
    for name in MODULES:
        importlib.import_module(name)
