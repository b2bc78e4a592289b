"""Plain data <-> JSON, for anything that crosses to or from the worker.

Encoding follows the value: a dataclass becomes a JSON object of its fields, a str-Enum its
value, a ``torch.dtype`` its name ("float32"), a tuple or list a JSON list, a mapping a JSON
object (string keys), a tensor a reference ``{"$tensor": i}`` into a list of tensors sent beside
the JSON as raw bytes (the same tensor object twice is one reference, so identity survives:
``Inputs.is_self`` relies on it).

Decoding follows the *type* the receiver expects, read from the dataclass annotations, and checks
every value against it: no class is ever chosen by the sender, unknown or missing fields are
errors, Literals and Enums must hold one of their values, ``object`` admits only JSON scalars and
lists of them. So the codec carries fields added to ``Capabilities`` and friends later (tuples of
ints, optional strings, Literals, str-Enums, nested dataclasses) without changes, and rejects a
malformed message from a hostile worker with one line saying where.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from enum import Enum
from functools import cache
from typing import Any

import torch

from conformance.errors import ConformanceError

DTYPES: dict[str, torch.dtype] = {
    str(dtype).removeprefix("torch."): dtype
    for dtype in (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
                  torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64,
                  torch.complex128)
}
"""The dtypes that may cross, by name."""

NAMES: dict[torch.dtype, str] = {dtype: name for name, dtype in DTYPES.items()}
"""The name each dtype that may cross goes by (the reverse of :data:`DTYPES`)."""

_MAX_DEPTH = 32


class CodecError(ConformanceError, ValueError):
    """A value that does not fit the type expected for it; the message says where."""


def encode(value: object, tensors: list[torch.Tensor]) -> Any:
    """``value`` as JSON-ready data; tensors are appended to ``tensors`` and referenced."""
    return _encode(value, tensors, {}, 0)


_PLAIN = frozenset({type(None), bool, int, float, str})
"""Types encoded as themselves, told by exact type (a str- or int-Enum member is not one)."""


@cache
def _field_names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))


def _encode(value: object, tensors: list[torch.Tensor], seen: dict[int, int], depth: int) -> Any:
    if depth > _MAX_DEPTH:
        raise CodecError("value nested too deeply")
    kind = type(value)
    if kind in _PLAIN:  # the common cases first: a request is mostly scalars and tensors
        return value
    if kind is torch.Tensor:
        return _reference(value, tensors, seen)
    if isinstance(value, (bool, int, float, str)) and not isinstance(value, Enum):
        return value
    if isinstance(value, Enum):
        if not isinstance(value.value, (str, int)):
            raise CodecError(f"enum {type(value).__name__} has a non-primitive value")
        return value.value
    if isinstance(value, torch.dtype):
        if value not in NAMES:
            raise CodecError(f"dtype {str(value).removeprefix('torch.')} cannot cross")
        return NAMES[value]
    if isinstance(value, torch.Tensor):
        return _reference(value, tensors, seen)
    if dataclasses.is_dataclass(kind):
        return {name: _encode(getattr(value, name), tensors, seen, depth + 1)
                for name in _field_names(kind)}
    if isinstance(value, (tuple, list)):
        return [_encode(item, tensors, seen, depth + 1) for item in value]
    if isinstance(value, Mapping):
        if not all(isinstance(key, str) for key in value):
            raise CodecError("mapping keys must be strings")
        return {key: _encode(item, tensors, seen, depth + 1) for key, item in value.items()}
    raise CodecError(f"a {type(value).__name__} cannot cross the boundary")


def _reference(tensor: torch.Tensor, tensors: list[torch.Tensor], seen: dict[int, int]) -> Any:
    index = seen.get(id(tensor))
    if index is None:
        index = seen[id(tensor)] = len(tensors)
        tensors.append(tensor)
    return {"$tensor": index}


def decode(data: Any, expected: Any, tensors: Sequence[torch.Tensor], where: str = "message") -> Any:
    """``data`` (parsed JSON) as a value of type ``expected``, checked; raises CodecError."""
    return _decoder(expected)(data, tensors, where, 0)


Decoder = Callable[[Any, Sequence[torch.Tensor], str, int], Any]


@cache
def _hints(cls: type) -> dict[str, Any]:
    # Each class's annotations resolve in its own module (a subclass may live elsewhere).
    return typing.get_type_hints(cls)


def _fail(where: str, expected: str, data: Any) -> CodecError:
    shown = repr(data)
    if len(shown) > 60:
        shown = shown[:57] + "..."
    return CodecError(f"{where}: expected {expected}, got {shown}")


def _deep(where: str, depth: int) -> None:
    if depth > _MAX_DEPTH:
        raise CodecError(f"{where}: nested too deeply")


@cache
def _decoder(expected: Any) -> Decoder:
    """The checking decoder for one type, built once per type (a closure tree)."""
    origin = typing.get_origin(expected)
    args = typing.get_args(expected)

    if expected is Any or expected is object:
        return _plain
    if expected is None or expected is type(None):
        def none(data, tensors, where, depth):
            if data is not None:
                raise _fail(where, "null", data)
            return None
        return none
    if origin in (typing.Union, types.UnionType):
        # None first, then the alternatives in order: `Literal[...] | float` tries the words first.
        options = sorted(args, key=lambda a: a is not type(None))
        decoders = [_decoder(option) for option in options]
        names = " or ".join(_name(option) for option in options)

        others = [_decoder(option) for option in options if option is not type(None)]

        def union(data, tensors, where, depth):
            if data is not None and len(others) == 1:  # `X | None`: X's own error says more
                return others[0](data, tensors, where, depth)
            for decoder in decoders:
                try:
                    return decoder(data, tensors, where, depth)
                except CodecError:
                    continue
            raise _fail(where, names, data)
        return union
    if origin is typing.Literal:
        def literal(data, tensors, where, depth):
            for option in args:
                if type(data) is type(option) and data == option:
                    return option
                if isinstance(option, Enum) and data == option.value:
                    return option
            raise _fail(where, f"one of {', '.join(repr(a) for a in args)}", data)
        return literal
    if expected in _SCALARS:
        return _SCALARS[expected]
    if expected is torch.dtype:
        def dtype(data, tensors, where, depth):
            if not isinstance(data, str) or data not in DTYPES:
                raise _fail(where, f"a dtype name ({', '.join(DTYPES)})", data)
            return DTYPES[data]
        return dtype
    if isinstance(expected, type) and issubclass(expected, torch.Tensor):
        return _tensor
    if isinstance(expected, type) and issubclass(expected, Enum):
        def enum(data, tensors, where, depth):
            try:
                return expected(data)
            except (ValueError, TypeError):
                raise _fail(where, f"one of {', '.join(repr(m.value) for m in expected)}",
                            data) from None
        return enum
    if origin in (tuple, list, Sequence) or expected in (tuple, list):
        return _sequence(expected, origin, args)
    if origin in (dict, Mapping) or expected in (dict, Mapping):
        key_type, value_type = args if args else (str, Any)
        if key_type is not str:
            raise CodecError(f"only string keys can cross ({expected!r})")
        value = _decoder(value_type)

        def mapping(data, tensors, where, depth):
            _deep(where, depth)
            if not isinstance(data, dict):
                raise _fail(where, "an object", data)
            return {key: value(item, tensors, f"{where}.{key}", depth + 1)
                    for key, item in data.items()}
        return mapping
    if dataclasses.is_dataclass(expected):
        return _dataclass(expected)
    raise CodecError(f"the codec does not know how to decode {expected!r}")


def _name(expected: Any) -> str:
    if expected is type(None):
        return "null"
    if typing.get_origin(expected) is typing.Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(expected))
    return getattr(expected, "__name__", None) or repr(expected)


def _boolean(data, tensors, where, depth):
    if not isinstance(data, bool):
        raise _fail(where, "a boolean", data)
    return data


def _integer(data, tensors, where, depth):
    if not isinstance(data, int) or isinstance(data, bool):
        raise _fail(where, "an integer", data)
    return data


def _number(data, tensors, where, depth):
    if not isinstance(data, (int, float)) or isinstance(data, bool):
        raise _fail(where, "a number", data)
    return float(data)


def _string(data, tensors, where, depth):
    if not isinstance(data, str):
        raise _fail(where, "a string", data)
    return data


_SCALARS: dict[type, Decoder] = {bool: _boolean, int: _integer, float: _number, str: _string}


def _tensor(data, tensors, where, depth):
    if (not isinstance(data, dict) or set(data) != {"$tensor"}
            or not isinstance(data["$tensor"], int) or isinstance(data["$tensor"], bool)
            or not 0 <= data["$tensor"] < len(tensors)):
        raise _fail(where, f"a tensor reference (0 to {len(tensors) - 1})", data)
    return tensors[data["$tensor"]]


def _sequence(expected: Any, origin: Any, args: tuple) -> Decoder:
    as_list = origin is list or expected is list
    if origin is tuple and args and args[-1] is not Ellipsis:
        items = [_decoder(arg) for arg in args]

        def fixed(data, tensors, where, depth):
            _deep(where, depth)
            if not isinstance(data, list):
                raise _fail(where, "a list", data)
            if len(data) != len(items):
                raise _fail(where, f"a list of {len(items)} items", data)
            return tuple(item(value, tensors, f"{where}[{i}]", depth + 1)
                         for i, (item, value) in enumerate(zip(items, data, strict=True)))
        return fixed
    item = _decoder(args[0] if args else Any)

    def variable(data, tensors, where, depth):
        _deep(where, depth)
        if not isinstance(data, list):
            raise _fail(where, "a list", data)
        values = [item(value, tensors, f"{where}[{i}]", depth + 1) for i, value in enumerate(data)]
        return values if as_list else tuple(values)
    return variable


def _dataclass(cls: type) -> Decoder:
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    required = {name for name, f in fields.items()
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
    decoders: dict[str, Decoder] = {}

    def instance(data, tensors, where, depth):
        _deep(where, depth)
        if not isinstance(data, dict):
            raise _fail(where, f"a {cls.__name__} object", data)
        unknown = sorted(set(data) - set(fields))
        if unknown:
            raise CodecError(f"{where}: {cls.__name__} has no field(s) {', '.join(unknown)}")
        missing = [name for name in fields if name in required and name not in data]
        if missing:
            raise CodecError(f"{where}: {cls.__name__}.{missing[0]} is missing")
        if not decoders:  # resolved on first use: the annotations may refer to later classes
            hints = _hints(cls)
            decoders.update({name: _decoder(hints[name]) for name in fields})
        values = {name: decoders[name](value, tensors, f"{where}.{name}", depth + 1)
                  for name, value in data.items()}
        try:
            return cls(**values)
        except (TypeError, ValueError) as error:  # the dataclass's own validation
            raise CodecError(f"{where}: not a valid {cls.__name__}: {error}") from None
    return instance


def _plain(data: Any, tensors: Sequence[torch.Tensor], where: str, depth: int) -> Any:
    """An ``object``-typed value: JSON scalars, and lists of them as tuples."""
    _deep(where, depth)
    if data is None or isinstance(data, (bool, int, float, str)):
        return data
    if isinstance(data, list):
        return tuple(_plain(item, tensors, f"{where}[{i}]", depth + 1)
                     for i, item in enumerate(data))
    raise _fail(where, "a JSON scalar or list", data)
