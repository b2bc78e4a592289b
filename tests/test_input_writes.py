"""What an in-process instance records as the implementation writing into its inputs: a changed
value is a write, a NaN left where it was is not (the comparison takes NaN as equal to NaN)."""

from __future__ import annotations

import pytest
import torch

from conformance import Capabilities, Config, Implementation
from conformance.subject.boundary import Inputs
from conformance.subject.in_process import ModuleInstance


def _instance(forward) -> ModuleInstance:
    implementation = Implementation("writer", lambda config: forward,
                                    Capabilities(call="self", mask=None))
    return ModuleInstance(implementation, Config(batch=1, q_len=3, kv_len=3, d_model=4,
                                                 num_heads=1), seed=0)


@pytest.mark.parametrize(("forward", "given", "written"), [
    (lambda x: x * 2, torch.ones(1, 3, 4), []),
    (lambda x: x.mul_(1.0) * 2, torch.ones(1, 3, 4), []),  # an in-place op that changes nothing
    (lambda x: x.add_(1.0) * 2, torch.ones(1, 3, 4), ["x"]),
    (lambda x: x * 2, torch.full((1, 3, 4), float("nan")), []),
    (lambda x: x.nan_to_num_(5.0) * 2, torch.full((1, 3, 4), float("nan")), ["x"]),
])
def test_a_write_is_a_changed_value(forward, given, written):
    instance = _instance(forward)
    instance.forward(Inputs.self_attention(given))
    assert instance.input_writes == written
