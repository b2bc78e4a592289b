"""A constructor that takes one config object (nanoGPT's ``CausalSelfAttention(config)``, a
``GPTConfig`` dataclass; minGPT's, a ``CfgNode``; a dict; a ``PretrainedConfig``): which fields
the layer reads, and a config of its own kind built with the values the suite chooses.

The fields are found by behaviour, not by a list: the constructor is given a recording stand-in
(:class:`Recorder`) that answers each field it is asked for (a default of the config's own class,
else a value a field of that name takes) and writes down every name read. Names then only order
which field is tried for which role, as a constructor argument's name does
(:func:`~conformance.inference.names.roles.roles_named`); what each field does is measured as a
constructor argument's is.

The config built for a check is of the layer's own config class where one is found (the
parameter's annotation, else a class of the layer's module that is a dataclass, a
``PretrainedConfig``, or takes keyword arguments and is named as a config) and takes the fields
read; else a namespace with those fields (a dict where the layer subscripts it).
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import io
import sys

from conformance.inference.names.roles import CONTEXT_LENGTH, role_of
from conformance.inference.plan import ConfigArgument, ConfigKind

CONFIG_NAMES = ("config", "cfg", "args", "hparams", "params", "conf", "opt", "opts",
                "model_config", "model_args", "hp", "hps", "configs", "attn_config",
                "attention_config", "settings")
"""Parameter names that suggest a config object: an order for the search, not a verdict (the
stand-in must be read from for a parameter to be one)."""

GUESSES = {"width": 16, "heads": 2, "head_dim": 8, "output": 16, "dropout": 0.0,
           "context": CONTEXT_LENGTH, "causal": True, "batch_first": True, "kv_heads": 2,
           "window": 1024, "chunk": 1024, "max_batch": 8}
"""What a field no default answers is given while recording, by the role its name suggests."""

UNNAMED = (0.0, 4, True)
"""What a field no name or default answers is tried with, in order, while recording."""

ROUNDS = 40
"""Constructor calls at most while recording (each one may name a field not yet answered)."""


class Recorder:
    """A stand-in config: each field read is written down (``reads``) and answered from
    ``values``; one not there is ``missing``, raised as AttributeError (KeyError subscripted),
    so that ``getattr(config, name, default)`` takes its default."""

    def __init__(self, values: dict[str, object]) -> None:
        object.__setattr__(self, "_values", values)
        object.__setattr__(self, "reads", [])
        object.__setattr__(self, "missing", [])
        object.__setattr__(self, "subscripted", False)

    def _read(self, name: str) -> object:
        if name not in self.reads:
            self.reads.append(name)
        if name in self._values:
            return self._values[name]
        if name not in self.missing:
            self.missing.append(name)
        raise AttributeError(name)

    def __getattr__(self, name: str) -> object:
        if name.startswith("__") or name in ("reads", "missing", "subscripted", "_values"):
            raise AttributeError(name)
        return self._read(name)

    def __getitem__(self, name: str) -> object:
        object.__setattr__(self, "subscripted", True)
        try:
            return self._read(name)
        except AttributeError:
            raise KeyError(name) from None

    def get(self, name: str, default: object = None) -> object:
        object.__setattr__(self, "subscripted", True)
        try:
            return self._read(name)
        except AttributeError:
            return default

    def __contains__(self, name: str) -> bool:
        return name in self._values


def _defaults(cls: type) -> dict[str, object] | None:
    """Every field of ``cls`` with its default, where ``cls()`` builds; None where it does not."""
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            made = cls()
    except Exception:  # its own validation: no defaults to read
        return None
    found: dict[str, object] = {}
    if dataclasses.is_dataclass(made):
        found.update({f.name: getattr(made, f.name) for f in dataclasses.fields(made)})
    found.update(vars(made) if hasattr(made, "__dict__") else {})
    to_dict = getattr(made, "to_dict", None)
    if callable(to_dict):
        with contextlib.suppress(Exception):
            listed = to_dict()
            found.update(listed if isinstance(listed, dict) else {})
    return found


def _takes_keywords(cls: type) -> bool:
    try:
        parameters = inspect.signature(cls).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.kind in (p.VAR_KEYWORD, p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)
               for p in parameters)


def _config_like(cls: object) -> bool:
    """A class a config can be made of: a dataclass, a ``PretrainedConfig``, or a class named as
    a config that takes keyword arguments (minGPT's ``CfgNode``)."""
    if not isinstance(cls, type):
        return False
    if dataclasses.is_dataclass(cls):
        return True
    if any(base.__name__ == "PretrainedConfig" for base in cls.__mro__):
        return True
    name = cls.__name__.lower()
    return ("config" in name or "cfg" in name or name.endswith("args")) and _takes_keywords(cls)


def _candidates(layer: type, parameter: inspect.Parameter) -> list[type]:
    """Config classes to make the config of, in order: the parameter's annotation, then the
    layer's module's config-like classes (a dataclass first)."""
    found: list[type] = []
    annotation = parameter.annotation
    if isinstance(annotation, str):
        annotation = vars(sys.modules.get(layer.__module__, object())).get(annotation)
    if _config_like(annotation):
        found.append(annotation)
    module = sys.modules.get(layer.__module__)
    for value in (vars(module).values() if module else ()):
        if _config_like(value) and value not in found:
            found.append(value)
    return sorted(found, key=lambda c: (c is not annotation, not dataclasses.is_dataclass(c)))


def _guess(name: str) -> object:
    role = role_of(name)
    if role is not None:
        return GUESSES[role]
    lowered = name.lower()
    if "drop" in lowered:
        return 0.0
    if "bias" in lowered:
        return True
    return UNNAMED[0]


OTHER_SIZE = 16
"""What another required argument no name explains is given while a config is recorded (a size
that divides by the few heads a config's guessed fields give)."""


def config_argument(layer: type) -> ConfigArgument | None:
    """The constructor parameter of ``layer`` that takes a config object and what it reads from
    it, where one does: a required parameter named as a config (or annotated with a class), the
    layer built with a recording stand-in there and each other required argument at what its
    name's role takes (else OTHER_SIZE: GPT-2's first ``Attention(nx, n_ctx, config)``); None
    where none is read from or no build succeeds."""
    try:
        parameters = list(inspect.signature(layer.__init__).parameters.values())[1:]
    except (TypeError, ValueError):
        return None
    required = [p for p in parameters if p.default is p.empty
                and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    for parameter in required:
        named = parameter.name in CONFIG_NAMES or parameter.name.endswith(("config", "cfg"))
        annotated = isinstance(parameter.annotation, type) and parameter.annotation not in (
            int, float, bool, str)
        if not (named or annotated):
            continue
        others = {p.name: GUESSES.get(role_of(p.name) or "", OTHER_SIZE) for p in required
                  if p is not parameter}
        found = _recorded(layer, parameter, others)
        if found is not None:
            return found
    return None


def _recorded(layer: type, parameter: inspect.Parameter,
              others: dict[str, object]) -> ConfigArgument | None:
    classes = _candidates(layer, parameter)
    defaults = next((d for d in map(_defaults, classes) if d is not None), None)
    values: dict[str, object] = dict(defaults or {})
    tried: dict[str, int] = {}
    for _ in range(ROUNDS):
        recorder = Recorder(values)
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                layer(**{parameter.name: recorder}, **others)
        except Exception:  # a field not answered yet, or a value it refuses: the next round's
            missing = [name for name in recorder.missing if name not in tried]
            if missing:
                for name in missing:
                    tried[name] = 0
                    values[name] = _guess(name)
                continue
            refused = next((n for n in reversed(recorder.reads) if n in tried
                            and tried[n] + 1 < len(UNNAMED) and role_of(n) is None), None)
            if refused is None:
                return None
            tried[refused] += 1
            values[refused] = UNNAMED[tried[refused]]
            continue
        break
    else:
        return None
    if not recorder.reads:
        return None
    fields = tuple(recorder.reads)
    kind, cls = ConfigKind.NAMESPACE, None
    if recorder.subscripted:
        kind = ConfigKind.DICT
    else:
        cls = next((c for c in classes if _holds(c, fields)), None)
        if cls is not None:
            kind = ConfigKind.KEYWORDS
    base = tuple((name, values[name]) for name in fields if name in values)
    return ConfigArgument(parameter.name, kind, cls, fields, base)


def _holds(cls: type, fields: tuple[str, ...]) -> bool:
    """Whether ``cls`` takes every field read as a keyword and keeps it: built with a
    placeholder for each, each reads back as given."""
    probe = {name: object() for name in fields}  # a dataclass refuses a field it lacks
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            made = cls(**probe)
    except Exception:  # its own validation refuses placeholders: fall back to a namespace
        return False
    return all(getattr(made, name, None) is value for name, value in probe.items())
