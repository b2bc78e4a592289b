"""The names a loaded file or module defines that could have been meant, for a name that is
not there: its attention classes, functions and implementations, the closest first."""

from __future__ import annotations

import difflib

import torch

from conformance.model.spec import Implementation


def candidates(container: object, missing: str) -> str:
    """``; it defines ...`` (its nn.Module classes and functions, the closest first), for a
    name that is not there."""
    module_name = getattr(container, "__name__", None)
    defined = [name for name, value in vars(container).items()
               if not name.startswith("_") and (isinstance(value, Implementation) or (
                   getattr(value, "__module__", None) == module_name
                   and ((isinstance(value, type) and issubclass(value, torch.nn.Module))
                        or (callable(value) and not isinstance(value, type)))))]
    if not defined:
        return ""
    close = difflib.get_close_matches(missing, defined, n=1, cutoff=0.6)
    ordered = close + [name for name in defined if name not in close]
    return (f"; did you mean {close[0]!r}?" if close else "") + \
        f" (it defines {', '.join(ordered[:12])}{', ...' if len(ordered) > 12 else ''})"
