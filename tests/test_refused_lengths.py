"""A length an implementation refuses on a device is its contract (conformance.checks.invariants.
gate, ``GateOutcome.shortest``): cuDNN's SDPA raises for a single key on an H200, where every
other length runs. The gate finds the shortest length that runs, says so, and every case is that
long or longer; a wrong output at one token is no refusal and still fails."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from conformance.loading.registry import resolve
from conformance.model.results import Status
from conformance.run.many import check_many

NO_KERNEL = "No available kernel. Aborting execution."


def one_key_refused(q, k, v, softmax_scale=None):
    """A kernel that refuses a single key, as cuDNN's SDPA does on CUDA."""
    if k.shape[-2] == 1:
        raise RuntimeError(NO_KERNEL)
    return F.scaled_dot_product_attention(q, k, v, scale=softmax_scale)


def one_key_refused_scale_dropped(q, k, v, softmax_scale=None):
    """BROKEN twin: refuses a single key too, and never passes the scale on."""
    if k.shape[-2] == 1:
        raise RuntimeError(NO_KERNEL)
    return F.scaled_dot_product_attention(q, k, v)


def one_key_zeroed(q, k, v, softmax_scale=None):
    """BROKEN: at a single key it returns zeros, where attention returns that key's value: a
    call that returns is no refusal."""
    if k.shape[-2] == 1:
        return torch.zeros_like(q)
    return F.scaled_dot_product_attention(q, k, v, scale=softmax_scale)


def _checked(name: str):
    spec = f"tests.test_refused_lengths:{name}"
    return check_many([(spec, resolve(spec)[0])], devices=["cpu"])


def test_a_kernel_that_refuses_one_key_passes_and_the_refusal_is_said():
    results = _checked("one_key_refused")
    assert not [r for r in results if r.status in (Status.FAILED, Status.SUITE_ERROR)]
    gate = next(r for r in results if r.check == "gate")
    said = " ".join(gate.observations)
    assert "refuses fewer than 2 tokens on cpu" in said and NO_KERNEL in said
    assert next(r for r in results if r.check == "contract").status is Status.PASSED


def test_its_twin_that_drops_the_scale_still_fails_kernel():
    failed = {r.check for r in _checked("one_key_refused_scale_dropped")
              if r.status is Status.FAILED}
    assert failed == {"kernel"}


def test_a_wrong_output_at_one_key_is_no_refusal():
    results = _checked("one_key_zeroed")
    gate = next(r for r in results if r.check == "gate")
    assert not any("refuses fewer" in said for said in gate.observations)
    assert {"reference", "row_stochastic"} <= {r.check for r in results
                                              if r.status is Status.FAILED}


def test_a_kernel_probed_forward_only_whose_backward_runs_here_has_its_gradients_checked():
    """As FlexAttention on CUDA after being probed on a CPU: its capabilities say forward only,
    and the gate finds the backward running on the device checked."""
    from dataclasses import replace

    from conformance.run.runner import Runner
    from conformance.subject.in_process import InProcessSubject

    implementation = resolve("tests.test_refused_lengths:one_key_refused")[0]
    probed = replace(implementation, capabilities=replace(implementation.capabilities,
                                                          forward_only=True))
    runner = Runner()
    subject = InProcessSubject(probed)
    gate = runner.run_check(subject, "gate", "cpu")
    assert any("its backward runs: the gradient checks run" in said
               for said in gate.observations)
    assert runner.run_check(subject, "autograd", "cpu").status is Status.PASSED
