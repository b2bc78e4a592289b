"""Each kind of target, one adapter in one table (:data:`KINDS`): what an object a target names
is, and the implementations it gives.

The kinds, in the order they are asked: implementations declared with
``@conformance.implementation``; a ``transformers`` model class, or a layer class built from a
config through the model beside it; an ``nn.Module`` layer class (inferred); another class (one
line: not a module); a function (a kernel, or an attention function in ``AttentionInterface``'s
form: inferred as a function); an ``nn.Module`` instance (a model holding attention layers, or a
layer checked as it is); another callable (one line: no declaration). A new kind of target is
one adapter here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from conformance.errors import one_line, raised_by_its_code
from conformance.loading.resolve_errors import ResolveError
from conformance.model.declarations import Declarations
from conformance.model.spec import Implementation


@dataclass(frozen=True)
class Request:
    """What resolving one object is asked: its ``origin`` (the name it is reported under), the
    ``declared`` declarations, the one kind ``named`` of a model's several (or FIRST) and the
    list ``others`` that receives the rest, and ``locate``, which finds what a located IMPL
    string names (a declared attention function's)."""

    origin: str
    declared: Declarations | None
    named: str | None
    others: list[str] | None
    locate: Callable[[str], object]


Adapter = Callable[[object, Request], "list[Implementation] | None"]
"""One kind of target: its implementations, or None where the object is not of its kind."""


def _probed(infer_it: Callable[[], Implementation], origin: str) -> list[Implementation]:
    """The implementation inferred, or one line: what inference found it can't settle, or what
    the module's own code raised while probed (never a traceback)."""
    from conformance.inference import InferenceError

    try:
        return [infer_it()]
    except InferenceError as error:
        raise ResolveError(str(error)) from error
    except Exception as error:
        where = raised_by_its_code(error)
        if where is None:
            raise  # the suite's own: reported as the suite's by each front end
        raise ResolveError(f"{origin}: its code raised {one_line(error, 160)} at {where} while "
                           "the suite probed how to call it; declare how it is called (see "
                           "docs/declarations.md), or fix what raised") from error


def _attention_function(request: Request, model: bool = True) -> tuple[str | None, tuple]:
    """The declared ``attn_implementation``'s registered name and how it was registered
    (:mod:`conformance.loading.attn_implementation`); ResolveError where it can't be used."""
    from conformance.loading.attn_implementation import AttnImplementationError, declared_function

    declared = request.declared
    try:
        return declared_function(declared.attn_implementation if declared else None,
                                 request.origin, model, request.locate)
    except AttnImplementationError as error:
        raise ResolveError(str(error)) from error


def declared(obj: object, request: Request) -> list[Implementation] | None:
    """An :class:`Implementation`, or a non-empty collection of them: as declared."""
    if isinstance(obj, Implementation):
        return [obj]
    if isinstance(obj, Iterable) and not isinstance(obj, (str, bytes, torch.nn.Module)):
        items = list(obj)
        if items and all(isinstance(item, Implementation) for item in items):
            return items
    return None


def model_class(obj: object, request: Request) -> list[Implementation] | None:
    """A model class: each kind of attention layer in it; a layer class built from a config:
    through the model it is defined with."""
    if not (isinstance(obj, type) and issubclass(obj, torch.nn.Module)):
        return None
    from conformance.inference import InferenceError
    from conformance.inference.models.model_route import (
        host_model,
        is_model_class,
        model_implementations,
    )

    model, only = (obj, None) if is_model_class(obj) else (host_model(obj), obj)
    if model is None:
        return None
    name, built = _attention_function(request)
    try:
        return [found.implementation for found in model_implementations(
            model, request.origin, request.declared, only=only, attn_implementation=name,
            built=built, named=request.named, others=request.others)]
    except InferenceError as error:
        raise ResolveError(str(error)) from error


def layer_class(obj: object, request: Request) -> list[Implementation] | None:
    """An ``nn.Module`` class: inferred."""
    if not (isinstance(obj, type) and issubclass(obj, torch.nn.Module)):
        return None
    from conformance.inference import infer

    _attention_function(request, model=False)
    return _probed(lambda: infer(obj, name=request.origin,
                                 declared=request.declared).implementation, request.origin)


def other_class(obj: object, request: Request) -> list[Implementation] | None:
    """A class that is no ``nn.Module``: one line."""
    if isinstance(obj, type):
        raise ResolveError(f"{request.origin} is a class but not a torch.nn.Module: an attention "
                           "layer subclasses torch.nn.Module (and calls super().__init__() "
                           "first)")
    return None


def function(obj: object, request: Request) -> list[Implementation] | None:
    """A function (a kernel, or an attention function in ``AttentionInterface``'s form):
    inferred as a function."""
    if not callable(obj) or isinstance(obj, torch.nn.Module):
        return None
    from conformance.inference import infer_function

    try:
        return _probed(lambda: infer_function(obj, name=request.origin,
                                              declared=request.declared).implementation,
                       request.origin)
    except (ValueError, TypeError) as error:  # its signature's problem, said in one line
        raise ResolveError(str(error)) from error


def instance(obj: object, request: Request) -> list[Implementation] | None:
    """An ``nn.Module`` instance: a model holding attention layers (each kind of them, driven
    through it), or a layer checked as it is."""
    if not isinstance(obj, torch.nn.Module):
        return None
    from conformance.inference import InferenceError, infer
    from conformance.inference.models.model_route import instance_implementations, with_attention

    name, built = _attention_function(request, model=hasattr(obj, "set_attn_implementation"))
    as_given, obj = obj, with_attention(obj, name)
    try:
        in_model = instance_implementations(obj, request.origin, request.declared, built,
                                            as_given, request.named, others=request.others)
    except InferenceError as error:
        raise ResolveError(str(error)) from error
    if in_model is not None:
        return [found.implementation for found in in_model]
    try:
        return _probed(lambda: infer(type(obj), name=request.origin, declared=request.declared,
                                     instance=obj).implementation, request.origin)
    except ResolveError as error:
        raise ResolveError(f"{request.origin} is an instance, checked as it is: {error}") \
            from error


KINDS: tuple[Adapter, ...] = (declared, model_class, layer_class, other_class, function,
                              instance)
"""Every kind of target, in the order an object is asked (a model class before a layer class:
both are ``nn.Module`` classes)."""


def implementations(obj: object, request: Request) -> list[Implementation]:
    """The implementations ``obj`` gives, by the first kind it is; ResolveError, one line, where
    it is none."""
    for adapter in KINDS:
        found = adapter(obj, request)
        if found is not None:
            return found
    if callable(obj):
        raise ResolveError(
            f"{request.origin} is {getattr(obj, '__name__', type(obj).__name__)}, which has no "
            "declaration: pass its class, or wrap its construction with "
            "@conformance.implementation(...) (see the README, 'Register your implementation')")
    raise ResolveError(
        f"{request.origin} is a {type(obj).__name__}, not an nn.Module, callable or "
        "Implementation")
