"""Check an attention class, instance or function with nothing declared: infer its interface.

:func:`infer` reads the constructor's parameter names, ``forward``'s signature and the submodules'
names and shapes, and probes behaviour only for what can't be read (the mask convention,
causality). Every inference is stated in :attr:`Inferred.notes`, so a report can open with what
the tool assumed; probing never turns a bug into an accepted convention (see
:mod:`conformance.inference.observing.probing`).
"""

from conformance.inference.functions.core_function import infer_function
from conformance.inference.infer import infer
from conformance.inference.plan import InferenceError, Inferred
from conformance.model.declarations import DeclarationError, Declarations

__all__ = ["DeclarationError", "Declarations", "InferenceError", "Inferred", "infer",
           "infer_function"]
