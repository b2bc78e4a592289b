"""A model class as a target: each kind of attention layer in it, inferred and checked driven
through the smallest model of its architecture (see the package docstring)."""

from __future__ import annotations

import copy
import inspect
import sys
from dataclasses import replace

from torch import nn

from conformance.errors import one_line
from conformance.inference.infer import infer
from conformance.inference.models.attention_layers import kinds, seen_not_attention
from conformance.inference.models.sides import MASK_KEYWORD, feeds, found_by_running
from conformance.inference.models.tiny_config import LAYERS, LONGEST, takes_kv_heads, tiny_config
from conformance.inference.plan import InferenceError, Inferred
from conformance.inference.steps.scale import DECLARED
from conformance.model.declaration_sources import for_layer
from conformance.model.declarations import Declarations, merged
from conformance.model.forms import LogitScale
from conformance.model.remedies import Note, Remedy, as_notes
from conformance.model.spec import FIRST, Capabilities
from conformance.subject.layer_in_model import Feed, LayerInModel, Side, driven_class

WIDTH, HEADS, KV_HEADS = 64, 4, 2
"""The model the layers are found in: width 64, 4 heads, 2 key/value heads where it has them."""

NO_ATTENTION = ("no submodule's forward ran a softmax or scaled_dot_product_attention on one "
                "forward of the model")
"""Why no attention layer was found in a model, wherever none is."""

TRANSFORMERS_CALL = {"use_cache": False}
"""What every call of a ``transformers`` model passes: no cache object between the suite's calls."""


def is_model_class(obj: object) -> bool:
    """Whether ``obj`` is a ``transformers`` model class (built from a config class)."""
    if not (isinstance(obj, type) and issubclass(obj, nn.Module)):
        return False
    config_class = getattr(obj, "config_class", None)
    return isinstance(config_class, type) and any(
        base.__name__ == "PreTrainedModel" for base in inspect.getmro(obj))


def host_model(layer_class: type) -> type | None:
    """The model class a layer class built from a config lives in: a ``transformers`` model
    class of the module that defines the layer (its base model first, which has no head to
    build); None where the layer's constructor takes no ``config`` or no such model is there."""
    try:
        parameters = list(inspect.signature(layer_class.__init__).parameters)
    except (TypeError, ValueError):
        return None
    if "config" not in parameters[1:2]:
        return None
    module = sys.modules.get(layer_class.__module__)
    found = [obj for obj in vars(module).values() if is_model_class(obj)
             and obj.__module__ == layer_class.__module__] if module else []
    found.sort(key=lambda cls: (not cls.__name__.endswith("Model"), cls.__name__))
    return found[0] if found else None


def with_attention(instance: nn.Module, name: str | None) -> nn.Module:
    """``instance`` as it is, but for the attention function registered as ``name`` that its
    layers call (a copy; ``instance`` itself where ``name`` is None)."""
    if name is None:
        return instance
    copied = copy.deepcopy(instance)
    copied.set_attn_implementation(name)
    return copied


def instance_implementations(instance: nn.Module, origin: str,
                             declared: Declarations | None = None,
                             built: tuple[Note, ...] = (),
                             as_given: nn.Module | None = None,
                             named: str | None = None,
                             only: type | None = None,
                             others: list[str] | None = None) -> list[Inferred] | None:
    """Where ``instance`` is a model that holds attention layers (not one itself), one inferred
    implementation per kind, each checked as it is (its sizes and weights) driven through a copy
    of the model; None where no submodule of it is an attention layer (it is checked as an
    instance of a layer). ``as_given``: the instance before an attention function was set in
    it, whose layers, sides and masks are the model's (found with its own attention);
    ``named``, ``others``: the one kind wanted (see :func:`wanted`); ``only``: the layers of
    that class alone."""
    probe = copy.deepcopy(as_given if as_given is not None else instance).eval()
    options = TRANSFORMERS_CALL if is_model_class(type(instance)) else {}
    ran = found_by_running(probe, options)
    if isinstance(ran, str) or not ran[1]:
        return None
    masked = "attention_mask" in inspect.signature(instance.forward).parameters
    fed = feeds(probe, ran[0], ran[1], options, masked)
    config = getattr(instance, "config", None)
    positions = getattr(config, "max_position_embeddings", None)
    inferred = []
    groups = {kind: paths for kind, paths in kinds(ran[1], config, _sides(fed)).items()
              if only is None or kind.partition(" (")[0] == only.__name__}
    for kind, paths in wanted(groups, origin, named, others).items():
        first = paths[0]
        driven = driven_class(fed[first])(copy.deepcopy(instance).eval(), first,
                                          feed=fed[first], options=options)
        one = infer(type(driven), name=f"{origin}:{first}",
                    declared=for_layer(declared, kind.partition(" (")[0]), instance=driven)
        inferred.append(_said(one, first, kind, paths, built, (
            f"the instance ({type(instance).__name__}, its own sizes and weights)"),
            positions if isinstance(positions, int) else None, fed[first]))
    return inferred


def wanted(groups: dict[str, list[str]], origin: str, named: str | None,
           others: list[str] | None = None) -> dict[str, list[str]]:
    """Of each kind's paths, those of the kind ``named`` (``origin:first path``, as it is
    named), where it is one, or of the first kind (``FIRST``; the others' names go into
    ``others``): a worker that checks one kind infers no other (each inference probes many
    models); all of them otherwise."""
    if named == FIRST and groups:
        first, *rest = groups
        if others is not None:
            others.extend(f"{origin}:{groups[kind][0]}" for kind in rest)
        return {first: groups[first]}
    chosen = {kind: paths for kind, paths in groups.items() if f"{origin}:{paths[0]}" == named}
    return chosen or groups


def _sides(fed: dict[str, Feed]) -> dict[str, str]:
    """Each layer's side of an encoder-decoder, in words (none for a single stack's)."""
    return {path: feed.side.value for path, feed in fed.items() if feed.side is not Side.ONLY}


def _said(one: Inferred, first: str, kind: str, paths: list[str], built: tuple[Note, ...],
          model: str, positions: int | None, feed: Feed) -> Inferred:
    """``one`` saying the paths it stands for, its model, how it is fed (``feed``) and how it
    was ``built``; ``positions``: the most the model takes (its ``max_position_embeddings``), a
    length no case goes past."""
    also = f", also {', '.join(paths[1:])}" if len(paths) > 1 else ""
    replaced = ("the case's hidden states replace the layer's queries' states and the "
                "encoder's states its keys come from" if feed.side is Side.CROSS else
                "the case's hidden states replace the layer's input")
    unmasked = (f"; no mask of the model's reaches it (its {MASK_KEYWORD[feed.side]} hiding a key "
                "changes nothing), so it is checked unmasked"
                if feed.mask is None and feed.side is not Side.ONLY else "")
    added = feed.residual
    where = f"argument {added!r}" if isinstance(added, str) else f"argument at position {added}"
    residual = ("" if added is None else
                f"; its forward adds its {where} to its output unchanged (a residual, measured: "
                "the output moves by exactly it), so it is given zeros there and its output is "
                "its attention's alone")
    said = as_notes([Note(f"{first}: {kind}{also}: driven by its model ({model}); {replaced}, "
                          f"everything else it receives is what the model computes{unmasked}"
                          f"{residual}", None), *built]) + one.notes
    caps = replace(one.implementation.capabilities, contiguous_only=feed.contiguous)
    if positions is not None and caps.max_len is None:
        caps = replace(caps, max_len=positions)
    return Inferred(replace(one.implementation, notes=said, capabilities=caps), said)


def _driven(model_class: type, kind: str, path: str, feed: Feed, grouped: bool,
            attn_implementation: str | None) -> type:
    """A LayerInModel class (as ``feed`` drives it) whose constructor takes the sizes the
    checks choose."""
    config_class = model_class.config_class

    def build(self, d_model, num_heads, num_kv_heads=None):
        config = tiny_config(config_class, d_model, num_heads, num_kv_heads if grouped else None,
                             attn_implementation)
        LayerInModel.__init__(self, model_class(config).eval(), path, feed=feed,
                              options=TRANSFORMERS_CALL)

    if not grouped:
        def __init__(self, d_model, num_heads):
            build(self, d_model, num_heads)
    else:
        def __init__(self, d_model, num_heads, num_kv_heads=None):
            build(self, d_model, num_heads, num_kv_heads)
    return type(kind.partition(" (")[0], (driven_class(feed),),
                {"__init__": __init__, "__module__": __name__,
                 "__qualname__": f"{model_class.__name__}.{path}"})


def model_implementations(model_class: type, origin: str,
                          declared: Declarations | None = None,
                          only: type | None = None, attn_implementation: str | None = None,
                          built: tuple[Note, ...] = (), named: str | None = None,
                          others: list[str] | None = None) -> list[Inferred]:
    """One inferred implementation per kind of attention layer in ``model_class`` (of class
    ``only``, where given: a layer class checked through the model it lives in), each named
    ``origin:path`` and saying the paths it stands for; built with the attention function
    registered as ``attn_implementation`` where given (``built`` says how); ``named``, ``others``:
    the one kind wanted (see :func:`wanted`)."""
    if declared is not None and declared.config is not None:
        return _built_from_file(model_class, origin, declared, only, attn_implementation, built,
                                named, others)
    grouped = takes_kv_heads(model_class.config_class)
    try:
        # Its layers, their sides and the masks that reach them are the model's, found with
        # its default attention (a function that ignores the mask must not read as a model
        # that passes none); built with the function too, so a refusal of it is said here.
        for implementation in ((attn_implementation, None) if attn_implementation else (None,)):
            model = model_class(tiny_config(model_class.config_class, WIDTH, HEADS,
                                            KV_HEADS if grouped else None,
                                            implementation)).eval()
    except Exception as error:
        raise InferenceError(f"{origin}: the smallest model of its architecture could not be "
                             f"built from {model_class.config_class.__name__} "
                             f"({one_line(error)}): pass an instance in a file, or a config "
                             "of its own", Remedy.to("config", "FILE.json", "build it from that "
                                                     "config")) from error
    skipped: dict[str, int] = {}
    ran = found_by_running(model, TRANSFORMERS_CALL, skipped)
    if isinstance(ran, str):
        raise InferenceError(f"{origin}: the smallest model of its architecture raised on every "
                             f"input the suite makes ({ran}): pass an instance in a file instead")
    first_input, found = ran
    seen = seen_not_attention(skipped)
    if not found:
        raise InferenceError(f"{origin}: no attention layer found: {NO_ATTENTION}"
                             + (f"; {seen}" if seen else ""))
    if seen:
        built = (*built, Note(seen, None))
    fed = feeds(model, first_input, found, TRANSFORMERS_CALL, masked=True)
    groups = kinds(found, model.config, _sides(fed))
    if only is not None:
        groups = {kind: paths for kind, paths in groups.items()
                  if kind.partition(" (")[0] == only.__name__}
        if not groups:
            raise InferenceError(f"{origin}: {model_class.__name__}, the model it is defined "
                                 f"with, holds no {only.__name__} its forward runs: pass an "
                                 "instance of the model in a file")
    inferred = []
    for kind, paths in wanted(groups, origin, named, others).items():
        first = paths[0]
        held, said = for_layer(declared, kind.partition(" (")[0]), built
        if attn_implementation is not None:
            held, said = _own_conventions(model_class, kind, first, fed[first], grouped, held,
                                          built)
        cls = _driven(model_class, kind, first, fed[first], grouped, attn_implementation)
        one = infer(cls, name=f"{origin}:{first}", declared=held)
        inferred.append(_said(one, first, kind, paths, said, (
            f"{model_class.__name__} built from {model_class.config_class.__name__}, width "
            f"{WIDTH}, {HEADS} heads" + (f", {KV_HEADS} key/value heads" if grouped else "")
            + f", {LAYERS} layers"), LONGEST, fed[first]))
    return inferred


def _built_from_file(model_class: type, origin: str, declared: Declarations,
                     only: type | None, attn_implementation: str | None,
                     built: tuple[Note, ...], named: str | None,
                     others: list[str] | None) -> list[Inferred]:
    """Each kind of attention layer in ``model_class`` built from the declared config file
    (``declared.config``: the config class's JSON, as ``save_pretrained`` writes it), checked as
    that instance is: its sizes and weights."""
    config_class, path = model_class.config_class, declared.config
    try:
        config = config_class.from_json_file(path)
        as_given = model_class(config).eval()
    except Exception as error:  # no such file, not JSON, not a config this model builds from
        raise InferenceError(f"{origin}: {model_class.__name__} could not be built from the "
                             f"declared config {path} ({one_line(error)})") from error
    instance = with_attention(as_given, attn_implementation)  # its layers found in as_given
    said = (*built, Note(f"built from the declared config {path} ({config_class.__name__}, "
                         f"width {getattr(config, 'hidden_size', '?')})", None))
    found = instance_implementations(instance, origin, declared, said, as_given, named, only,
                                     others)
    if not found:
        raise InferenceError(f"{origin}: no attention layer found in {model_class.__name__} "
                             f"built from {path}: {NO_ATTENTION}")
    return found


_OWN: dict[tuple, Capabilities] = {}
"""The capabilities of each kind of layer built with its model's default attention, by what it
was inferred from: the same for every function a model is built with."""


def _own_capabilities(model_class: type, kind: str, path: str, feed: Feed, grouped: bool,
                      declared: Declarations) -> Capabilities:
    key = (model_class, kind, path, feed, grouped, declared)
    try:
        cached = _OWN.get(key)
    except TypeError:  # a declaration holding an unhashable value: inferred anew
        cached, key = None, None
    if cached is None:
        cached = infer(_driven(model_class, kind, path, feed, grouped, None),
                       name=f"{model_class.__name__}:{path}",
                       declared=declared).implementation.capabilities
        if key is not None:
            _OWN[key] = cached
    return cached


def _own_conventions(model_class: type, kind: str, path: str, feed: Feed, grouped: bool,
                     declared: Declarations | None,
                     built: tuple[Note, ...]) -> tuple[Declarations, tuple[Note, ...]]:
    """``declared`` with the conventions the model's own attention has (the layer at ``path``
    built with the model's default implementation, inferred): its causality, its key/value
    grouping and its logit scale, where not declared. A function registered in a model is held
    to the model's conventions, which its checkpoints are in, not asked for intent (a function
    the model hands no mask still owes its causal LM causality); and the note that says so."""
    own = _own_capabilities(model_class, kind, path, feed, grouped,
                            replace(declared or Declarations(), attn_implementation=None))
    held = Declarations()
    said = []
    if own.causality.kind == "always" and (declared is None or declared.causal is None):
        held = merged(held, Declarations(causal="always"))
        said.append("causal attention")
    if grouped and (declared is None or declared.kv_grouping is None):
        grouping = "tiled" if own.doubts.kv_grouping is not None else "interleaved"
        held = merged(held, Declarations(kv_grouping=grouping))
        said.append(f"key/value grouping {grouping}")
    law = own.position.encoding.scale if own.position.encoding is not None else None
    scale = _scale_declared(law)
    if scale is not None and (declared is None or declared.scale is None):
        held = merged(held, Declarations(scale=scale))
        said.append(f"logit scale {scale}")
    if not said:
        return declared, built
    note = Note(f"{' and '.join(said)} declared for it: the model's own attention has "
                f"{'them' if len(said) > 1 else 'it'} (probed, built with its default attention), "
                "and so do its checkpoints", None)
    return merged(declared or Declarations(), held), (*built, note)


def _scale_declared(law: LogitScale | None) -> str | None:
    """The ``scale`` declaration that states ``law`` (None: the textbook 1/sqrt(w)); None where
    a setting sets it or no declaration states it."""
    if law is None:
        return "sqrt"
    if law.argument is not None or abs(law.factor - 1.0) > 1e-6:
        return None
    return next((name for name, power in DECLARED.items() if power == law.power), None)
