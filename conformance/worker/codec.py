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
import sys
import types
import typing
from collections.abc import Mapping, Sequence
from enum import Enum
from functools import cache
from typing import Any

import torch

DTYPES: dict[str, torch.dtype] = {
    str(dtype).removeprefix("torch."): dtype
    for dtype in (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
                  torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64,
                  torch.complex128)
}
"""The dtypes that may cross, by name."""

_MAX_DEPTH = 32


class CodecError(ValueError):
    """A value that does not fit the type expected for it; the message says where."""


def encode(value: object, tensors: list[torch.Tensor]) -> Any:
    """``value`` as JSON-ready data; tensors are appended to ``tensors`` and referenced."""
    return _encode(value, tensors, {}, 0)


def _encode(value: object, tensors: list[torch.Tensor], seen: dict[int, int], depth: int) -> Any:
    if depth > _MAX_DEPTH:
        raise CodecError("value nested too deeply")
    if value is None or (isinstance(value, (bool, int, float, str)) and not isinstance(value, Enum)):
        return value
    if isinstance(value, Enum):
        if not isinstance(value.value, (str, int)):
            raise CodecError(f"enum {type(value).__name__} has a non-primitive value")
        return value.value
    if isinstance(value, torch.dtype):
        name = str(value).removeprefix("torch.")
        if name not in DTYPES:
            raise CodecError(f"dtype {name} cannot cross")
        return name
    if isinstance(value, torch.Tensor):
        index = seen.get(id(value))
        if index is None:
            index = seen[id(value)] = len(tensors)
            tensors.append(value)
        return {"$tensor": index}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _encode(getattr(value, f.name), tensors, seen, depth + 1)
                for f in dataclasses.fields(value)}
    if isinstance(value, (tuple, list)):
        return [_encode(item, tensors, seen, depth + 1) for item in value]
    if isinstance(value, Mapping):
        if not all(isinstance(key, str) for key in value):
            raise CodecError("mapping keys must be strings")
        return {key: _encode(item, tensors, seen, depth + 1) for key, item in value.items()}
    raise CodecError(f"a {type(value).__name__} cannot cross the boundary")


def decode(data: Any, expected: Any, tensors: Sequence[torch.Tensor], where: str = "message") -> Any:
    """``data`` (parsed JSON) as a value of type ``expected``, checked; raises CodecError."""
    return _decode(data, expected, tensors, where, 0)


@cache
def _hints(cls: type) -> dict[str, Any]:
    module = sys.modules.get(cls.__module__)
    return typing.get_type_hints(cls, vars(module) if module else None)


def _fail(where: str, expected: str, data: Any) -> CodecError:
    shown = repr(data)
    if len(shown) > 60:
        shown = shown[:57] + "..."
    return CodecError(f"{where}: expected {expected}, got {shown}")


def _decode(data: Any, expected: Any, tensors: Sequence[torch.Tensor], where: str,
            depth: int) -> Any:
    if depth > _MAX_DEPTH:
        raise CodecError(f"{where}: nested too deeply")
    origin = typing.get_origin(expected)
    args = typing.get_args(expected)

    if expected is Any or expected is object:
        return _plain(data, where, depth)
    if expected is None or expected is type(None):
        if data is not None:
            raise _fail(where, "null", data)
        return None
    if origin in (typing.Union, types.UnionType):
        errors = []
        # None first, then the alternatives in order: `Literal[...] | float` tries the words first.
        for option in sorted(args, key=lambda a: a is not type(None)):
            try:
                return _decode(data, option, tensors, where, depth)
            except CodecError as error:
                errors.append(str(error).rpartition(": expected ")[2].split(", got")[0])
        raise _fail(where, " or ".join(errors), data)
    if origin is typing.Literal:
        for option in args:
            if type(data) is type(option) and data == option:
                return option
            if isinstance(option, Enum) and data == option.value:
                return option
        raise _fail(where, f"one of {', '.join(repr(a) for a in args)}", data)
    if expected is bool:
        if not isinstance(data, bool):
            raise _fail(where, "a boolean", data)
        return data
    if expected is int:
        if not isinstance(data, int) or isinstance(data, bool):
            raise _fail(where, "an integer", data)
        return data
    if expected is float:
        if not isinstance(data, (int, float)) or isinstance(data, bool):
            raise _fail(where, "a number", data)
        return float(data)
    if expected is str:
        if not isinstance(data, str):
            raise _fail(where, "a string", data)
        return data
    if expected is torch.dtype:
        if not isinstance(data, str) or data not in DTYPES:
            raise _fail(where, f"a dtype name ({', '.join(DTYPES)})", data)
        return DTYPES[data]
    if isinstance(expected, type) and issubclass(expected, torch.Tensor):
        if (not isinstance(data, dict) or set(data) != {"$tensor"}
                or not isinstance(data["$tensor"], int) or isinstance(data["$tensor"], bool)
                or not 0 <= data["$tensor"] < len(tensors)):
            raise _fail(where, f"a tensor reference (0 to {len(tensors) - 1})", data)
        return tensors[data["$tensor"]]
    if isinstance(expected, type) and issubclass(expected, Enum):
        try:
            return expected(data)
        except (ValueError, TypeError):
            raise _fail(where, f"one of {', '.join(repr(m.value) for m in expected)}",
                        data) from None
    if origin in (tuple, list, Sequence) or expected in (tuple, list):
        if not isinstance(data, list):
            raise _fail(where, "a list", data)
        if origin is tuple and args and args[-1] is not Ellipsis:
            if len(data) != len(args):
                raise _fail(where, f"a list of {len(args)} items", data)
            items = [_decode(item, arg, tensors, f"{where}[{i}]", depth + 1)
                     for i, (item, arg) in enumerate(zip(data, args, strict=True))]
        else:
            arg = args[0] if args else Any
            items = [_decode(item, arg, tensors, f"{where}[{i}]", depth + 1)
                     for i, item in enumerate(data)]
        return items if origin is list or expected is list else tuple(items)
    if origin in (dict, Mapping) or expected in (dict, Mapping):
        if not isinstance(data, dict):
            raise _fail(where, "an object", data)
        key_type, value_type = args if args else (str, Any)
        if key_type is not str:
            raise CodecError(f"{where}: only string keys can cross")
        return {key: _decode(value, value_type, tensors, f"{where}.{key}", depth + 1)
                for key, value in data.items()}
    if dataclasses.is_dataclass(expected):
        return _decode_dataclass(data, expected, tensors, where, depth)
    raise CodecError(f"{where}: the codec does not know how to decode {expected!r}")


def _decode_dataclass(data: Any, cls: type, tensors: Sequence[torch.Tensor], where: str,
                      depth: int) -> Any:
    if not isinstance(data, dict):
        raise _fail(where, f"a {cls.__name__} object", data)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise CodecError(f"{where}: {cls.__name__} has no field(s) {', '.join(unknown)}")
    hints = _hints(cls)
    values = {}
    for name, field in fields.items():
        if name not in data:
            if (field.default is dataclasses.MISSING
                    and field.default_factory is dataclasses.MISSING):
                raise CodecError(f"{where}: {cls.__name__}.{name} is missing")
            continue
        values[name] = _decode(data[name], hints[name], tensors, f"{where}.{name}", depth + 1)
    try:
        return cls(**values)
    except (TypeError, ValueError) as error:  # the dataclass's own validation (__post_init__)
        raise CodecError(f"{where}: not a valid {cls.__name__}: {error}") from None


def _plain(data: Any, where: str, depth: int) -> Any:
    """An ``object``-typed value: JSON scalars, and lists of them as tuples."""
    if depth > _MAX_DEPTH:
        raise CodecError(f"{where}: nested too deeply")
    if data is None or isinstance(data, (bool, int, float, str)):
        return data
    if isinstance(data, list):
        return tuple(_plain(item, f"{where}[{i}]", depth + 1) for i, item in enumerate(data))
    raise _fail(where, "a JSON scalar or list", data)
