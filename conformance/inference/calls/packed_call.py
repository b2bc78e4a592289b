"""A call form guessed from the signature, settled by behaviour before anything is checked.

Three required forward arguments whose names are no query/key/value names are read as q, k, v;
that is a guess. It is tried: three float (B, L, D) tensors. Where that call fails, the packed
varlen form is tried (FlashAttention's ``flash_attn_varlen_func`` and the encoders built on it):
tokens (total, D), an int32 offsets tensor (n + 1,) and an int, the longest sequence. Whichever
runs is the call; where neither does, the module is not checked, and the report says how to
declare the call: a guess never turns into a failure of the module.
"""

from __future__ import annotations

import contextlib
import io
from dataclasses import replace

import torch

from conformance.errors import one_line
from conformance.inference.plan import CALL_REMEDY, InferenceError, Plan
from conformance.model.spec import Config

PROBES = ((2, 4), (4, 4), (1, 8), (8, 8))
"""(heads, head_dim) tried until the constructor builds."""


def _module(plan: Plan) -> tuple[torch.nn.Module, Config] | None:
    for heads, head_dim in PROBES:
        config = Config(batch=2, q_len=5, kv_len=5, d_model=heads * head_dim, num_heads=heads)
        try:
            return plan.instantiate(config).eval(), config
        except Exception:  # the constructor refuses this configuration; try the next
            continue
    return None


def _call(module: torch.nn.Module, *args: object, **kwargs: object) -> torch.Tensor | None:
    try:
        with torch.no_grad(), contextlib.redirect_stdout(io.StringIO()):
            output = module(*args, **kwargs)
    except Exception as error:  # the call form is wrong, whatever it raises
        return error
    return output[0] if isinstance(output, (tuple, list)) and output else output


def settle_call(plan: Plan, label: str, notes: list[str]) -> None:
    """Confirm a guessed q, k, v call, or find the packed form instead (``plan.convention``
    changes); InferenceError where neither runs."""
    convention = plan.convention
    if convention.packed and not convention.packed_only and convention.call == "self":
        _settle_optional_offsets(plan, label, notes)
        return
    if not convention.call_guessed:
        return
    built = _module(plan)
    if built is None:
        return  # nothing builds: the constraints step reports the constructor
    module, config = built
    if convention.call == "cross":
        _settle_cross(plan, module, config, label, notes)
        return
    tensors = [torch.randn(2, 5, config.d_model) for _ in range(3)]
    qkv = _call(module, *tensors)
    if isinstance(qkv, torch.Tensor) and tuple(qkv.shape[:2]) == (2, 5):
        return
    first, second, third = convention.inputs
    x = torch.randn(9, config.d_model)
    cu_seqlens = torch.tensor([0, 4, 9], dtype=torch.int32)
    packed = _call(module, x, cu_seqlens, 5)
    if isinstance(packed, torch.Tensor) and tuple(packed.shape) == (9, config.d_model):
        plan.convention = replace(convention, call="self", inputs=(first,), packed=second,
                                  max_seqlen=third, packed_only=True, call_guessed=False)
        notes.append(f"{first}, {second}, {third}: packed tokens (total, D), int32 offsets "
                     "(n + 1,) and the longest sequence (probed: called as q, k, v it raises "
                     f"{_reason(qkv)}; called packed it returns the tokens' shape); a batch is "
                     "checked packed, each element one sequence")
        return
    raise InferenceError(
        f"{label}: forward({first}, {second}, {third}) takes three required arguments that "
        f"are not named query, key, value; called as q, k, v it raises {_reason(qkv)}, called "
        f"as packed tokens with offsets {_reason(packed)}", CALL_REMEDY)


def _settle_optional_offsets(plan: Plan, label: str, notes: list[str]) -> None:
    """A packed argument with a default: where the call without it raises and packed tokens
    with offsets run, it is called packed from the gate on (its offsets are needed)."""
    built = _module(plan)
    if built is None:
        return
    module, config = built
    plain = _call(module, torch.randn(2, 5, config.d_model))
    if isinstance(plain, torch.Tensor) and tuple(plain.shape[:2]) == (2, 5):
        return  # it runs unpacked: packing is probed as a feature of its own
    convention = plan.convention
    offsets = {convention.packed: torch.tensor([0, 4, 9], dtype=torch.int32)}
    if convention.max_seqlen:
        offsets[convention.max_seqlen] = 5
    packed = _call(module, torch.randn(9, config.d_model), **offsets)
    # Where the packed form fails too, the gate reports the plain call.
    if isinstance(packed, torch.Tensor) and tuple(packed.shape) == (9, config.d_model):
        plan.convention = replace(convention, packed_only=True, call_guessed=False)
        notes.append(f"{convention.inputs[0]}, {convention.packed}: packed tokens (total, D) and "
                     f"int32 offsets (probed: called without {convention.packed} it raises "
                     f"{_reason(plain)}; called packed it returns the tokens' shape); a batch is "
                     "checked packed, each element one sequence")


CONTEXT_LENGTH = 7
"""The context's length in the probe of a guessed cross call: another than the queries' 5."""


def _settle_cross(plan: Plan, module: torch.nn.Module, config: Config, label: str,
                  notes: list[str]) -> None:
    """Confirm two required tensors as queries' states and the context keys and values come
    from: a context of another length runs, the output has the queries' rows, and another
    context changes it. A second argument the output ignores is no context: the module is
    called as it was read before (self-attention, that argument left to the gate to report)."""
    first, second = plan.convention.inputs
    x = torch.randn(2, 5, config.d_model)
    output = _call(module, x, torch.randn(2, CONTEXT_LENGTH, config.d_model))
    other = _call(module, x, torch.randn(2, CONTEXT_LENGTH, config.d_model))
    if isinstance(output, torch.Tensor) and isinstance(other, torch.Tensor) and \
            tuple(output.shape[:2]) == (2, 5) and torch.equal(output, other):
        plan.convention = replace(plan.convention, call="self", inputs=(first,),
                                  call_guessed=False)
        return
    if isinstance(output, torch.Tensor) and tuple(output.shape[:2]) == (2, 5):
        notes.append(f"{second}: the context keys and values come from (probed: one of "
                     f"{CONTEXT_LENGTH} tokens runs beside {first} of 5, and the output has "
                     f"{first}'s rows); checked as cross-attention with contexts of their own "
                     "lengths")
        return
    raise InferenceError(
        f"{label}: forward({first}, {second}) takes two required tensors; called as queries "
        f"and a context of another length it raises {_reason(output)}", CALL_REMEDY)


def _reason(outcome: object) -> str:
    if isinstance(outcome, BaseException):
        return one_line(outcome, 100)
    if isinstance(outcome, torch.Tensor):
        return f"nothing, but returns shape {tuple(outcome.shape)}"
    return f"nothing, but returns {type(outcome).__name__}"
