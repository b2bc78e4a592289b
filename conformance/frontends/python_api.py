"""The Python API as users call it (``conformance.check``, ``conformance.infer``, ...): the same
functions, with an error's remedy said as a Python user declares it (``declare={...}``), in a
note on the exception (PEP 678) so its one line and its type stay as they are."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import ParamSpec, TypeVar

from conformance.errors import ConformanceError
from conformance.frontends.interface_language import remedy_words
from conformance.inference.functions.core_function import infer_function as _infer_function
from conformance.inference.infer import infer as _infer
from conformance.model.remedies import remedy_of
from conformance.run.many import check as _check
from conformance.run.many import check_many as _check_many

P = ParamSpec("P")
R = TypeVar("R")


def _said_for_python(function: Callable[P, R]) -> Callable[P, R]:
    @functools.wraps(function)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return function(*args, **kwargs)
        except ConformanceError as error:
            remedy = remedy_of(error)
            if remedy is not None and hasattr(error, "add_note"):  # Python >= 3.11
                error.add_note(remedy_words(remedy, "python"))
            raise
    return wrapper


check = _said_for_python(_check)
check_many = _said_for_python(_check_many)
infer = _said_for_python(_infer)
infer_function = _said_for_python(_infer_function)
