"""Kernels first-class: half-precision-only attention functions with hand-written backward
passes (:mod:`conformance.implementations.kernels`), checked with nothing declared.

First the proof, without the suite: the bundled kernels' outputs and gradients against a float64
attention written here, in both layouts, causal (bottom-right) or not, over several key blocks;
each broken twin's gradient is off. Then what the suite makes of them: every check passes in
float16 and bfloat16 and none in float32 is asked for, every twin FAILs the check its bug breaks,
what a kernel refuses is stated and never a failure, and a kernel that runs nowhere here is one
line and exit 2.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from conformance import Status, check
from conformance.frontends.cli import main
from conformance.implementations import kernels
from conformance.implementations.kernel_mutants import KERNEL_MUTANT_MODULES
from conformance.inference import Declarations, InferenceError, infer_function
from conformance.model.remedies import texts
from conformance.run.runner import BLOCKED
from tests.fixtures import kernel_refusals

GRADIENT_CASES = [  # (layout, causal, q_len, kv_len[, kv_heads]): beyond one block of 16 keys
    ("bhld", False, 5, 37), ("bhld", True, 37, 37), ("blhd", True, 6, 21), ("blhd", False, 1, 3),
    ("bhld", True, 9, 9, 1), ("blhd", False, 4, 17, 1)]


def oracle(q, k, v, causal):
    """float64 attention over (B, H, L, D), causal aligned bottom-right; k and v may have fewer
    heads (query head h reads h // G)."""
    q, k, v = (t.detach().double().requires_grad_(True) for t in (q, k, v))
    groups = q.shape[1] // k.shape[1]
    scores = q @ k.repeat_interleave(groups, 1).transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        lq, lk = scores.shape[-2:]
        seen = torch.ones(lq, lk, dtype=torch.bool).tril(lk - lq)
        scores = scores.masked_fill(~seen, float("-inf"))
    return (q, k, v), torch.softmax(scores, -1) @ v.repeat_interleave(groups, 1)


def gradients(function, layout, dtype, causal, q_len, kv_len, kv_heads=3):
    """(kernel's (out, dq, dk, dv), the oracle's), over (B, H, L, D) whatever the layout; 3
    query heads over ``kv_heads``."""
    generator = torch.Generator().manual_seed(q_len * 100 + kv_len)
    shape = lambda length, heads=3: (2, heads, length, 8)  # noqa: E731
    q, k, v = (torch.randn(shape(n, h), generator=generator, dtype=torch.float64)
               for n, h in ((q_len, 3), (kv_len, kv_heads), (kv_len, kv_heads)))
    dout = torch.randn(shape(q_len), generator=generator, dtype=torch.float64)
    leaves = [t.to(dtype).requires_grad_(True) for t in (q, k, v)]
    given = [t.transpose(1, 2) if layout == "blhd" else t for t in leaves]
    out = function(*given, causal=causal)
    out = out.transpose(1, 2) if layout == "blhd" else out
    # A non-contiguous cotangent (its last two axes' memory order swapped), as a model gives.
    out.backward(dout.to(dtype).transpose(-1, -2).contiguous().transpose(-1, -2))
    (oq, ok, ov), expected = oracle(q, k, v, causal)
    expected.backward(dout)
    return ((out.detach().double(), *(t.grad.double() for t in leaves)),
            (expected.detach(), oq.grad, ok.grad, ov.grad))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("case", GRADIENT_CASES, ids=str)
def test_the_kernels_compute_attention_and_its_derivative(dtype, case):
    layout, causal, q_len, kv_len, *kv_heads = case
    function = dict(bhld=kernels.half_attention, blhd=kernels.flash_layout_half_attention)[layout]
    assert function.layout == layout
    actual, expected = gradients(function, layout, dtype, causal, q_len, kv_len, *kv_heads)
    allowed = 4 * torch.finfo(dtype).eps * 8
    for name, a, e in zip(("out", "dq", "dk", "dv"), actual, expected, strict=True):
        assert float((a - e).abs().max()) <= allowed * max(1.0, float(e.abs().max())), name


@pytest.mark.parametrize(("arguments", "q_len"), [
    (dict(window_size=(2, 0)), 5), (dict(window_size=(1, 2)), 37), (dict(softcap=1.0), 5),
    (dict(softcap=1.0, causal=True), 5), (dict(softmax_scale=0.7, causal=True), 1),
    (dict(alibi_slopes=torch.tensor([0.5, 0.125])), 5),
    (dict(alibi_slopes=torch.tensor([0.5, 0.125]), causal=True), 37)])
def test_the_kernels_arguments_against_a_float64_oracle(arguments, q_len):
    """Window (bottom-right, FlashAttention's), softcap before the mask, an explicit scale, ALiBi
    slopes, and the lse returned, over 37 keys, in float16."""
    generator = torch.Generator().manual_seed(q_len)
    q, k, v = (torch.randn(1, 2, n, 8, generator=generator, dtype=torch.float64)
               for n in (q_len, 37, 37))
    out, lse = kernels.half_attention(q.half(), k.half(), v.half(), return_lse=True, **arguments)
    scale = arguments.get("softmax_scale", 8 ** -0.5)
    scores = q @ k.transpose(-1, -2) * scale
    if "softcap" in arguments:
        scores = arguments["softcap"] * torch.tanh(scores / arguments["softcap"])
    rows = torch.arange(q_len)[:, None] + 37 - q_len
    cols = torch.arange(37)[None, :]
    if "alibi_slopes" in arguments:  # FlashAttention's: -m_h |i + Lk - Lq - j|
        scores = scores - arguments["alibi_slopes"].double()[:, None, None] * (rows - cols).abs()
    left, right = arguments.get("window_size", (-1, -1))
    right = 0 if arguments.get("causal") else right
    seen = torch.ones(q_len, 37, dtype=torch.bool)
    seen &= (cols >= rows - left) if left >= 0 else seen
    seen &= (cols <= rows + right) if right >= 0 else seen
    scores = scores.masked_fill(~seen, float("-inf"))
    assert float((out.double() - torch.softmax(scores, -1) @ v).abs().max()) < 1e-2
    assert float((lse.double() - torch.logsumexp(scores, -1)).abs().max()) < 1e-2


def test_the_varlen_kernel_is_each_sequence_alone_and_its_twin_crosses_a_boundary():
    """Sequences of 3, 0 (empty) and 4 queries over 5, 2 and 6 keys, causal, in float16: each
    against the float64 oracle on that sequence alone; the twin is exact on one sequence."""
    from conformance.implementations.kernel_mutants import varlen_boundary_off_by_one as twin

    generator = torch.Generator().manual_seed(5)
    lengths_q, lengths_k = (3, 0, 4), (5, 2, 6)
    q = torch.randn(sum(lengths_q), 2, 8, generator=generator, dtype=torch.float64)
    k, v = (torch.randn(sum(lengths_k), 2, 8, generator=generator, dtype=torch.float64)
            for _ in range(2))
    cu_q, cu_k = (torch.tensor([0, *itertools.accumulate(n)], dtype=torch.int32)
                  for n in (lengths_q, lengths_k))
    packed = kernels.varlen_half_attention(q.half(), k.half(), v.half(), cu_q, cu_k, 4, 6,
                                           causal=True)
    assert packed.shape == q.shape
    for i in (0, 2):  # sequence 1 is empty: no rows of its own
        rows, keys = slice(cu_q[i], cu_q[i + 1]), slice(cu_k[i], cu_k[i + 1])
        head_first = [t.transpose(0, 1)[None] for t in (q[rows], k[keys], v[keys])]
        alone = oracle(*head_first, True)[1].detach()[0].transpose(0, 1)
        assert float((packed[rows].double() - alone).abs().max()) < 1e-2
    one = [t[:3].half() for t in (q, k, v)]
    whole = torch.tensor([0, 3], dtype=torch.int32)
    assert torch.equal(twin.KERNEL(*one, whole, whole, 3, 3),
                       kernels.varlen_half_attention(*one, whole, whole, 3, 3))
    crossed = twin.KERNEL(q.half(), k.half(), v.half(), cu_q, cu_k, 4, 6, causal=True)
    assert float((crossed - packed).abs().max()) > 0.05


def test_the_cache_kernel_writes_its_caches_and_its_twin_does_not():
    """A prefill of 3 tokens, then one decode step, into (B, 8, H, D) caches: the caches hold
    exactly the keys written, and the step equals the oracle's last row; the twin leaves its
    caches as they were and its step reads zeros."""
    from conformance.implementations.kernel_mutants import cache_not_updated as twin

    generator = torch.Generator().manual_seed(9)
    q, k, v = (torch.randn(2, 4, 2, 8, generator=generator).half() for _ in range(3))
    for function, writes in ((kernels.kvcache_half_attention, True), (twin.KERNEL, False)):
        k_cache, v_cache = torch.zeros(2, 8, 2, 8).half(), torch.zeros(2, 8, 2, 8).half()
        prefill = function(q[:, :3], k_cache, v_cache, k=k[:, :3], v=v[:, :3], causal=True,
                           cache_seqlens=torch.zeros(2, dtype=torch.int32))
        assert torch.equal(k_cache[:, :3], k[:, :3]) is writes
        step = function(q[:, 3:], k_cache, v_cache, k=k[:, 3:], v=v[:, 3:], causal=True,
                        cache_seqlens=torch.full((2,), 3, dtype=torch.int32))
        full = oracle(*(t.transpose(1, 2).double() for t in (q, k, v)), True)[1].detach()
        expected = full.transpose(1, 2)
        assert float((prefill.double() - expected[:, :3]).abs().max()) < 1e-2  # both exact
        error = float((step.double() - expected[:, 3:]).abs().max())
        assert (error < 1e-2) is writes


def test_the_kernel_drops_with_rescaling_and_its_twin_without():
    """The same draw (same seed): the twin's train-mode output is (1 - p) times the kernel's;
    at p = 0 both are the oracle's; and the kernel's mean over many draws is the oracle's."""
    from conformance.implementations.kernel_mutants import dropout_unscaled as twin

    generator = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, 2, 5, 8, generator=generator, dtype=torch.float64)
               for _ in range(3))
    exact = oracle(q, k, v, False)[1].detach()
    draws = []
    for seed in range(400):
        torch.manual_seed(seed)
        draws.append(kernels.half_attention(q.half(), k.half(), v.half(), dropout_p=0.5).double())
    torch.manual_seed(0)
    dropped = twin.KERNEL(q.half(), k.half(), v.half(), dropout_p=0.5).double()
    assert float((dropped - 0.5 * draws[0]).abs().max()) < 1e-2
    assert float((twin.KERNEL(q.half(), k.half(), v.half()).double() - exact).abs().max()) < 1e-2
    assert float((torch.stack(draws).mean(0) - exact).abs().max()) < 0.15


def test_paged_caches_equal_contiguous_ones_and_the_table_ignoring_twin_does_not():
    """A prefill of 5 then a step, through pages of 4 handed out shuffled (the suite's own
    paging), against contiguous caches; the twin agrees only where the table is in order."""
    from conformance.implementations.kernel_mutants import paged_cache_table_ignored as twin
    from conformance.inference.functions.cache_function import paged

    generator = torch.Generator().manual_seed(13)
    q, k, v = (torch.randn(2, 6, 2, 8, generator=generator).half() for _ in range(3))

    def decode(function, table_order):
        (k_cache, v_cache), table = paged(k, 4, 8)
        table = table if table_order == "shuffled" else torch.arange(
            table.numel(), dtype=table.dtype).reshape(table.shape)
        outs = [function(q[:, :5], k_cache, v_cache, k=k[:, :5], v=v[:, :5], causal=True,
                         block_table=table, cache_seqlens=torch.zeros(2, dtype=torch.int32)),
                function(q[:, 5:], k_cache, v_cache, k=k[:, 5:], v=v[:, 5:], causal=True,
                         block_table=table, cache_seqlens=torch.full((2,), 5, dtype=torch.int32))]
        return torch.cat(outs, 1)

    contiguous = kernels.kvcache_half_attention(q, k, v, causal=True)
    assert torch.equal(decode(kernels.kvcache_half_attention, "shuffled"), contiguous)
    assert torch.equal(decode(twin.KERNEL, "in order"), contiguous)
    assert float((decode(twin.KERNEL, "shuffled") - contiguous).abs().max()) > 0.05


BACKWARD_TWINS = [m for m in KERNEL_MUTANT_MODULES if m.CATCHES == "reference"]
ARGUMENT_TWINS = [m for m in KERNEL_MUTANT_MODULES if m.CATCHES == "kernel"]
NAME = lambda module: module.__name__.rsplit(".")[-1]  # noqa: E731


@pytest.mark.parametrize("module", BACKWARD_TWINS, ids=NAME)
def test_every_backward_twin_has_a_wrong_gradient_and_an_exact_forward(module):
    actual, expected = gradients(module.KERNEL, module.KERNEL.layout, torch.float16, False, 5, 37,
                                 getattr(module, "KV_HEADS", 3))
    errors = [float((a - e).abs().max()) for a, e in zip(actual, expected, strict=True)]
    assert errors[0] < 1e-2  # the forward is right
    assert max(errors[1:]) > 0.1  # some gradient is far off


@pytest.mark.parametrize("module", ARGUMENT_TWINS, ids=NAME)
def test_every_argument_twin_is_exact_by_default_and_wrong_through_its_argument(module):
    """Against the bundled kernel (proved above) in the twin's layout: the same output without
    the twin's arguments, another output (or lse) with them (2 queries over 6 keys)."""
    correct = kernels.kernel_function(kernels.Kernel(), module.KERNEL.layout)
    generator = torch.Generator().manual_seed(3)
    shape = (lambda n: (1, 2, n, 8)) if module.KERNEL.layout == "bhld" else (lambda n: (1, n, 2, 8))
    q, k, v = (torch.randn(shape(n), generator=generator).half() for n in (2, 6, 6))

    def differ(**arguments) -> float:
        mine, theirs = ((f(q, k, v, **arguments),) for f in (module.KERNEL, correct))
        if arguments.get("return_lse"):
            mine, theirs = mine[0], theirs[0]
        return max(float((a.double() - b.double()).abs().max()) for a, b in zip(mine, theirs,
                                                                             strict=True))

    assert differ() == 0.0
    exposed = {name: torch.tensor(value) if isinstance(value, list) else value
               for name, value in module.EXPOSED_BY.items()}
    assert differ(**exposed) > 0.05


def test_a_half_only_kernel_is_checked_in_half_precision_and_passes():
    inferred = infer_function(kernels.half_attention)
    caps = inferred.implementation.capabilities
    assert caps.floats.supported == (torch.float16, torch.bfloat16) and caps.floats.assumed == ()
    assert any(note.startswith("runs in float16, bfloat16 on cpu (probed") and
               "refuses float32" in note for note in texts(inferred.notes))
    results = check(inferred.implementation, devices=["cpu"])
    failed = [(r.check, r.reason) for r in results if r.status is not Status.SKIPPED
              and r.status is not Status.PASSED]
    assert failed == []
    ran = {r.check for r in results if r.status is Status.PASSED}
    assert {"reference", "scale", "causal", "head_split", "row_stochastic", "autograd",
            "kernel", "kv_groups", "dropout"} <= ran


@pytest.mark.parametrize(("function", "form"), [(kernels.varlen_half_attention, "packed"),
                                                (kernels.kvcache_half_attention, "kv_cache")])
def test_the_varlen_and_cache_kernels_pass_their_forms_with_nothing_declared(function, form):
    results = check(function, devices=["cpu"],
                    checks=["gate", "reference", "causal", "kernel", form])
    assert {r.check: r.status for r in results} == dict.fromkeys(
        ("gate", "reference", "causal", "kernel", form), Status.PASSED)


def test_the_flash_layout_kernel_passes_with_nothing_declared():
    results = check(kernels.flash_layout_half_attention, devices=["cpu"],
                    checks=["gate", "reference", "causal", "head_split", "scale", "kernel"])
    assert {r.status for r in results} == {Status.PASSED}


@pytest.mark.parametrize("module", KERNEL_MUTANT_MODULES, ids=NAME)
def test_every_kernel_mutant_fails_the_check_it_targets(module):
    """With nothing declared, or what its documentation states (``DECLARE``)."""
    (result,) = check(module.KERNEL, devices=["cpu"], checks=[module.CATCHES],
                      declare=getattr(module, "DECLARE", None))
    assert result.status is Status.FAILED, result.reason
    assert "float16" in result.counterexample or "bfloat16" in result.counterexample


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_the_jacobian_bug_fails_reference_in_each_half_dtype(dtype):
    from conformance.implementations.kernel_mutants import jacobian_rowsum_missing

    case = (f"Case(batch=2, q_len=4, kv_len=4, num_heads=2, head_dim=4, dtype='{dtype}', "
            "seed=1)")
    (result,) = check(jacobian_rowsum_missing.KERNEL, devices=["cpu"], checks=["reference"],
                      replay=case)
    assert result.status is Status.FAILED
    assert "gradient" in result.reason


def test_what_a_kernel_refuses_is_stated_not_failed():
    inferred = infer_function(kernel_refusals.float32_only_attention)
    assert inferred.implementation.capabilities.floats.supported == (torch.float32,)
    (note,) = [n for n in texts(inferred.notes) if n.startswith("runs in")]
    assert "refuses float64, float16, bfloat16 (TypeError: expected float32" in note
    results = check(inferred.implementation, devices=["cpu"], checks=["gate", "contract"])
    assert {r.status for r in results} == {Status.PASSED}


def test_a_declared_alignment_is_the_kernels_contract():
    from conformance.implementations.kernel_mutants import causal_top_left

    (measured,) = check(causal_top_left.KERNEL, devices=["cpu"], checks=["kernel"])
    assert measured.status is Status.PASSED  # top-left, stated: intent nobody declared
    notes = texts(infer_function(causal_top_left.KERNEL,
                           declared=Declarations(causal_alignment="bottom-right")).notes)
    assert ("causal aligned bottom-right (declared; measured top-left: kernel holds it to the "
            "declaration)") in notes


def test_a_base2_lse_is_a_warning_and_a_top_left_kernel_passes():
    from tests.fixtures import kernel_variants

    (base2,) = check(kernel_variants.base2_lse_attention, devices=["cpu"], checks=["kernel"])
    assert base2.status is Status.WARNED and "in base 2" in base2.reason
    (top_left,) = check(kernel_variants.top_left_attention, devices=["cpu"], checks=["kernel"])
    assert top_left.status is Status.PASSED


@pytest.mark.parametrize(("name", "words"), [
    ("output_scaled_attention", "scale=0.5 changes the output into something other than "
                                "softmax(scale q.k) v"),
    ("int_window_attention", "window_size=(2, 0) raises (TypeError: window_size must be an int)")])
def test_an_argument_of_another_form_is_stated_and_not_checked(name, words):
    from tests.fixtures import kernel_variants

    function = getattr(kernel_variants, name)
    assert any(note.startswith(words) for note in texts(infer_function(function).notes))
    (result,) = check(function, devices=["cpu"], checks=["kernel"])
    assert result.status is not Status.FAILED


@pytest.mark.parametrize("name", ["inference_only_attention", "no_backward_attention"])
def test_a_forward_only_kernel_is_stated_and_its_gradients_not_asked_for(name):
    from tests.fixtures import kernel_variants

    function = getattr(kernel_variants, name)
    assert any(note.startswith("forward only: ") for note in texts(infer_function(function).notes))
    results = {r.check: r for r in check(function, devices=["cpu"])}
    assert not [c for c, r in results.items() if r.status is Status.FAILED]
    assert results["autograd"].reason == "forward only (probed): no backward to check"
    assert results["reference"].status is Status.PASSED


def test_a_backward_that_crashes_is_a_bug_not_a_refusal():
    from tests.fixtures import kernel_variants

    function = kernel_variants.crashing_backward_attention
    assert not any(note.startswith("forward only") for note in texts(infer_function(function).notes))
    (result,) = check(function, devices=["cpu"], checks=["reference"])
    assert result.status is Status.FAILED and "shape mismatch in dK" in result.reason


def test_a_kernel_that_runs_nowhere_here_is_one_line_and_exit_2(capsys):
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is here: the CUDA-only kernel runs")
    with pytest.raises(InferenceError, match="runs nowhere here: on cpu it raises in every "
                       r"dtype .*no CUDA device is here"):
        infer_function(kernel_refusals.cuda_only_attention)
    code = main(["check", "tests.fixtures.kernel_refusals:cuda_only_attention"])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and err.count("\n") == 1 and "runs nowhere here" in err


def test_a_blocked_gate_is_said_once(capsys):
    code = main(["check", "tests.fixtures.kernel_refusals:float32_only_attention",
                 "--dtypes", "float16", "--no-isolate"])
    out, _ = capsys.readouterr()
    assert code == 1
    assert out.count("expected float32 tensors") == 1  # the gate's reason, once
    assert " ".join(out.split()).count(BLOCKED) == 1  # the blocked checks under one reason


def test_causal_alignment_is_measured_and_stated():
    from tests.fixtures import core_functions

    bottom_right = texts(infer_function(kernels.flash_layout_half_attention).notes)
    top_left = texts(infer_function(core_functions.flash_layout_attention).notes)
    assert any(n.startswith("causal aligned bottom-right (probed") for n in bottom_right)
    assert any(n.startswith("causal aligned top-left (probed") for n in top_left)


def test_shape_limits_are_probed_stated_and_generated_within():
    inferred = infer_function(kernel_refusals.multiple_of_8_attention)
    assert ("builds and runs only with head_dim a multiple of 8: generating those configurations "
            "(probed)") in texts(inferred.notes)
    results = check(inferred.implementation, devices=["cpu"],
                    checks=["gate", "reference", "causal", "kernel"])
    assert {r.status for r in results} == {Status.PASSED}
    assert not [note for r in results for note in r.observations if "refuses" in note]


def test_a_layer_refusing_float64_nobody_declared_is_checked_without_it():
    results = {r.check: r for r in check(kernel_refusals.Float32OnlyLayer, devices=["cpu"],
                                         checks=["gate", "contract", "batch_independence"])}
    assert {r.status for r in results.values()} == {Status.PASSED}
    assert any(note.startswith("refuses float64, which nobody declared (forward raised")
               for note in results["gate"].observations)
    declared = check(kernel_refusals.Float32OnlyLayer, devices=["cpu"], checks=["contract"],
                     declare={"dtypes": "float32,float64"})
    assert declared[0].status is Status.FAILED  # declared, float64 is its contract


def test_a_kernel_that_takes_no_gradient_on_the_cpu_is_forward_only_never_a_traceback():
    inferred = infer_function(kernel_refusals.no_grad_on_cpu_attention)
    assert inferred.implementation.capabilities.forward_only
    assert any("raises NotImplementedError: FlexAttention does not support backward on CPU for "
               "inputs that require gradients" in n for n in texts(inferred.notes))
    results = {r.check: r for r in check(inferred.implementation, devices=["cpu"])}
    assert not [r.reason for r in results.values() if r.status is Status.FAILED]
    assert results["autograd"].status is Status.SKIPPED
    assert results["path_agreement"].status is Status.PASSED


def test_a_dropout_rate_the_kernel_raises_on_is_stated_and_dropout_skips():
    inferred = infer_function(kernel_refusals.no_dropout_attention)
    assert inferred.implementation.capabilities.dropout == "none"
    assert any(n.startswith("dropout_p=0.5 raises (ValueError: dropout not supported in this "
                            "build): dropout is refused") for n in texts(inferred.notes))
    (result,) = check(inferred.implementation, devices=["cpu"], checks=["dropout"])
    assert result.status is Status.SKIPPED


def test_a_kernel_that_refuses_the_cpu_is_inferred_where_it_runs_and_the_cpu_is_its_refusal(
        monkeypatch):
    """The device boundary faked: "cuda" is this CPU with a flag the kernel reads. Inference
    probes it there (its dtypes there), the CPU is a refusal stated, and a run on the CPU alone
    checks nothing: skipped, saying why, never a failure, never OK."""
    import functools

    from conformance.inference.functions import core_function

    def fake_bridge(function, device):
        @functools.wraps(function)
        def on_fake_device(*args, **kwargs):
            monkeypatch.setattr(kernel_refusals, "ON_DEVICE", True)
            try:
                return function(*args, **kwargs)
            finally:
                monkeypatch.setattr(kernel_refusals, "ON_DEVICE", False)
        return on_fake_device

    monkeypatch.setattr(core_function, "accelerator", lambda: "cuda")
    monkeypatch.setattr(core_function, "on_device", fake_bridge)
    inferred = infer_function(kernel_refusals.device_only_attention)
    caps = inferred.implementation.capabilities
    assert caps.floats.supported == (torch.float16, torch.bfloat16)
    assert caps.refused_devices == (("cpu", "it raises in every dtype there; float32: "
                                     "RuntimeError: No available kernel. Aborting execution."),)
    (note,) = [n for n in texts(inferred.notes) if n.startswith("runs in")]
    assert note.startswith("runs in float16, bfloat16 on cuda (probed")
    assert "; refuses cpu (it raises in every dtype there" in note
    results = check(inferred.implementation, devices=["cpu"], checks=["gate", "reference"])
    assert {r.status for r in results} == {Status.SKIPPED}
    assert results[0].reason.startswith("refuses cpu (probed: it raises in every dtype there")
