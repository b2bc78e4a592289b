"""A model class as a target: each kind of attention layer in it, inferred and checked driven
through the smallest model of its architecture (see the package docstring)."""

from __future__ import annotations

import copy
import inspect
import sys
from dataclasses import replace

import torch
from torch import nn

from conformance.errors import one_line
from conformance.inference.infer import infer
from conformance.inference.models.attention_layers import attention_paths, kinds
from conformance.inference.models.tiny_config import LAYERS, LONGEST, takes_kv_heads, tiny_config
from conformance.inference.plan import InferenceError, Inferred
from conformance.model.declarations import Declarations, merged
from conformance.model.remedies import Note, as_notes
from conformance.subject.layer_in_model import LayerInModel, UnmaskedLayerInModel

WIDTH, HEADS, KV_HEADS = 64, 4, 2
"""The model the layers are found in: width 64, 4 heads, 2 key/value heads where it has them."""

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


def _found_by_running(model: nn.Module) -> tuple[bool, dict[str, nn.Module]] | str:
    """(whether it takes token ids, its attention layers) from one forward: on token ids first,
    else on hidden states as wide as its first linear layer takes; where neither runs, what the
    first raised, in one line."""
    linear = next((m for m in model.modules() if isinstance(m, nn.Linear)), None)
    tries = [(True, torch.zeros(1, 5, dtype=torch.long))]
    if linear is not None:
        tries.append((False, torch.randn(1, 5, linear.in_features)))
    raised = []
    for ids, sample in tries:
        try:
            return ids, attention_paths(model, lambda m, s=sample: m(s))
        except Exception as error:  # the model's own refusal of this input: the next form
            raised.append(one_line(error, 200))
    return raised[0]


def instance_implementations(instance: nn.Module, origin: str,
                             declared: Declarations | None = None,
                             built: tuple[Note, ...] = ()) -> list[Inferred] | None:
    """Where ``instance`` is a model that holds attention layers (not one itself), one inferred
    implementation per kind, each checked as it is (its sizes and weights) driven through a copy
    of the model; None where no submodule of it is an attention layer (it is checked as an
    instance of a layer)."""
    probe = copy.deepcopy(instance).eval()
    ran = _found_by_running(probe)
    if isinstance(ran, str) or not ran[1]:
        return None
    ids, found = ran
    masked = "attention_mask" in inspect.signature(instance.forward).parameters
    options = TRANSFORMERS_CALL if is_model_class(type(instance)) else {}
    positions = getattr(getattr(instance, "config", None), "max_position_embeddings", None)
    inferred = []
    for kind, paths in kinds(found, getattr(instance, "config", None)).items():
        first = paths[0]
        driven = (LayerInModel if masked else UnmaskedLayerInModel)(
            copy.deepcopy(instance).eval(), first, ids=ids, options=options)
        one = infer(type(driven), name=f"{origin}:{first}", declared=declared, instance=driven)
        inferred.append(_said(one, first, kind, paths, built, (
            f"the instance ({type(instance).__name__}, its own sizes and weights)"),
            positions if isinstance(positions, int) else None))
    return inferred


def _said(one: Inferred, first: str, kind: str, paths: list[str], built: tuple[Note, ...],
          model: str, positions: int | None = None) -> Inferred:
    """``one`` saying the paths it stands for, its model and how it was ``built``;
    ``positions``: the most the model takes (its ``max_position_embeddings``), a length no case
    goes past."""
    also = f", also {', '.join(paths[1:])}" if len(paths) > 1 else ""
    said = as_notes([Note(f"{first}: {kind}{also}: driven by its model ({model}); the case's "
                          "hidden states replace the layer's input, everything else it receives "
                          "is what the model computes", None), *built]) + one.notes
    caps = one.implementation.capabilities
    if positions is not None and caps.max_len is None:
        caps = replace(caps, max_len=positions)
    return Inferred(replace(one.implementation, notes=said, capabilities=caps), said)


def _driven(model_class: type, kind: str, path: str, ids: bool, grouped: bool,
            attn_implementation: str | None) -> type:
    """A LayerInModel class whose constructor takes the sizes the checks choose."""
    config_class = model_class.config_class

    def build(self, d_model, num_heads, num_kv_heads=None):
        config = tiny_config(config_class, d_model, num_heads, num_kv_heads if grouped else None,
                             attn_implementation)
        LayerInModel.__init__(self, model_class(config).eval(), path, ids=ids,
                              options=TRANSFORMERS_CALL)

    if not grouped:
        def __init__(self, d_model, num_heads):
            build(self, d_model, num_heads)
    else:
        def __init__(self, d_model, num_heads, num_kv_heads=None):
            build(self, d_model, num_heads, num_kv_heads)
    return type(kind.partition(" (")[0], (LayerInModel,),
                {"__init__": __init__, "__module__": __name__,
                 "__qualname__": f"{model_class.__name__}.{path}"})


def model_implementations(model_class: type, origin: str,
                          declared: Declarations | None = None,
                          only: type | None = None, attn_implementation: str | None = None,
                          built: tuple[Note, ...] = ()) -> list[Inferred]:
    """One inferred implementation per kind of attention layer in ``model_class`` (of class
    ``only``, where given: a layer class checked through the model it lives in), each named
    ``origin:path`` and saying the paths it stands for; built with the attention function
    registered as ``attn_implementation`` where given (``built`` says how)."""
    grouped = takes_kv_heads(model_class.config_class)
    try:
        model = model_class(tiny_config(model_class.config_class, WIDTH, HEADS,
                                        KV_HEADS if grouped else None,
                                        attn_implementation)).eval()
    except Exception as error:
        raise InferenceError(f"{origin}: the smallest model of its architecture could not be "
                             f"built from {model_class.config_class.__name__} "
                             f"({one_line(error)}): pass an instance in a file instead") from error
    ran = _found_by_running(model)
    if isinstance(ran, str):
        raise InferenceError(f"{origin}: the smallest model of its architecture raised on token "
                             f"ids ({ran}) and on hidden states: pass an instance in a file "
                             "instead")
    ids, found = ran
    if not found:
        raise InferenceError(f"{origin}: no attention layer found: no submodule's forward ran a "
                             "softmax or scaled_dot_product_attention on one forward of the "
                             "model")
    groups = kinds(found, model.config)
    if only is not None:
        groups = {kind: paths for kind, paths in groups.items()
                  if kind.partition(" (")[0] == only.__name__}
        if not groups:
            raise InferenceError(f"{origin}: {model_class.__name__}, the model it is defined "
                                 f"with, holds no {only.__name__} its forward runs: pass an "
                                 "instance of the model in a file")
    inferred = []
    for kind, paths in groups.items():
        first = paths[0]
        held, said = declared, built
        if attn_implementation is not None and grouped and (
                declared is None or declared.kv_grouping is None):
            held, said = _own_grouping(model_class, kind, first, ids, origin, declared, built)
        cls = _driven(model_class, kind, first, ids, grouped, attn_implementation)
        one = infer(cls, name=f"{origin}:{first}", declared=held)
        inferred.append(_said(one, first, kind, paths, said, (
            f"{model_class.__name__} built from {model_class.config_class.__name__}, width "
            f"{WIDTH}, {HEADS} heads" + (f", {KV_HEADS} key/value heads" if grouped else "")
            + f", {LAYERS} layers"), LONGEST))
    return inferred


def _own_grouping(model_class: type, kind: str, path: str, ids: bool, origin: str,
                  declared: Declarations | None,
                  built: tuple[Note, ...]) -> tuple[Declarations, tuple[Note, ...]]:
    """``declared`` with the key/value grouping the model's own attention has (the layer at
    ``path`` built with the model's default implementation, inferred): a function registered
    in a model is held to the model's convention, which its checkpoints are in, not asked for
    intent; and the note that says so."""
    own = infer(_driven(model_class, kind, path, ids, True, None), name=f"{origin}:{path}",
                declared=declared)
    grouping = ("tiled" if own.implementation.capabilities.doubts.kv_grouping is not None
                else "interleaved")
    note = Note(f"key/value grouping {grouping} declared for it: the model's own attention "
                f"groups its heads so (probed, built with its default attention), and so do its "
                "checkpoints", None)
    return merged(declared or Declarations(), Declarations(kv_grouping=grouping)), (*built, note)
