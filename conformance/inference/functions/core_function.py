"""Core attention functions, ``f(q, k, v[, mask][, causal])`` over per-head tensors, checked
inside the suite's own projections.

The projections are correct by construction, so every check applies to the function and any
failure is the function's. The axes are (batch, heads, length, head_dim), PyTorch's SDPA
layout, or (batch, length, heads, head_dim), FlashAttention's: behaviour decides (with batch,
heads and length pairwise distinct, nudging one slice of the key/value inputs along an axis
changes the output only in that slice when the axis is the heads, everywhere when it is the
tokens), or the ``layout`` declaration states it.

Dtypes by behaviour: the function is called once in each of float32, float64, float16 and
bfloat16; those it runs in are its contract (a kernel written for half precision only is checked
in half precision, every check), those it refuses are stated, never a failure. Inference itself
runs the suite's projections in float32 and hands the function its own dtype where it refuses
float32 (:attr:`CoreFunctionModule.compute_dtype`); the checks call it in each dtype it runs in,
projections included. The weights are the suite's own projections, known by construction.
"""

from __future__ import annotations

import functools
import inspect
import re
from dataclasses import replace

import torch

from conformance.generation.cases import dtype_name
from conformance.inference.functions.cache_function import cache_function_class, is_cache_kernel, page_size
from conformance.inference.functions.function_wrapper import DROPOUT_ARGUMENTS, core_function_class
from conformance.inference.functions.interface_function import is_interface_function, kernel_view
from conformance.inference.functions.kernel_arguments import (
    call_output,
    kernel_arguments,
    per_head,
    refusal,
    refuses,
)
from conformance.inference.functions.varlen_function import dense_view, is_varlen
from conformance.inference.infer import infer
from conformance.inference.plan import ALL_DTYPES, InferenceError, Inferred, declarations_read
from conformance.model.capability_groups import Dtypes
from conformance.model.declarations import Declarations
from conformance.model.forms import CausalAlignment, KernelArguments
from conformance.model.remedies import Note, Remedy, as_notes
from conformance.numerics.threads import one_thread
from conformance.numerics.tolerance import unchanged_tolerance

_DTYPE_WORDS = re.compile(r"(torch\.)?(b?float(16|32|64)|half|double|float)\b")

OWN_WEIGHTS = "q_proj,k_proj,v_proj,out_proj"
"""The wrapper's projections (:class:`HeadProjections`), in the weights declaration's words."""

INTERFACE_WORDS = ("transformers' AttentionInterface form: called as a model calls it, with "
                   "the calling layer's num_key_value_groups, is_causal and scaling, the mask "
                   "with the causal triangle folded in, its (B, Lq, H, D) output read back")
"""How a function in ``AttentionInterface``'s form is called (see
:mod:`conformance.inference.functions.interface_function`)."""

LAYOUT_WORDS = {"bhld": "(batch, heads, length, head_dim)",
                "blhd": "(batch, length, heads, head_dim)"}


def takes_grouped(function, layout: str, dtype: torch.dtype) -> bool:
    """Whether ``function`` takes fewer key/value heads than query heads (4 query heads over 2):
    it runs and returns the queries' shape. Which query head reads which key/value head is
    ``kv_groups``' to check."""
    generator = torch.Generator().manual_seed(17)
    q, k, v = (per_head(layout, 5, generator, dtype, heads=heads, batch=2) for heads in (4, 2, 2))
    try:
        with torch.no_grad():
            out = call_output(function(q, k, v))
    except Exception:  # it takes as many key/value heads as query heads: no grouping
        return False
    return out is not None and out.shape == q.shape


PROBE_SHAPE = (2, 3, 5, 8)
"""The per-head tensors the function is first called on: a valid (B, H, L, D) and (B, L, H, D)
alike, batch, heads and length pairwise distinct, head_dim 8 (kernels often take multiples of
8 only)."""


def dtype_probe(function) -> tuple[tuple[torch.dtype, ...], dict[torch.dtype, str]]:
    """(the dtypes ``function`` runs in, {refused dtype: why}): one call per dtype on
    PROBE_SHAPE tensors, on the CPU; a call runs when it returns a tensor (or an ``(out, lse)``
    pair) of the input's shape."""
    runs, refused = [], {}
    for dtype in ALL_DTYPES:
        generator = torch.Generator().manual_seed(5)
        q, k, v = (torch.randn(PROBE_SHAPE, generator=generator).to(dtype) for _ in range(3))
        try:
            with torch.no_grad():
                result = function(q, k, v)
        except Exception as error:  # the function's own refusal, whatever it raises
            refused[dtype] = refusal(error)
            continue
        out = call_output(result)
        if out is None or tuple(out.shape) != PROBE_SHAPE:
            shown = (f"shape {tuple(out.shape)}" if out is not None else
                     f"a {type(result).__name__}")
            refused[dtype] = f"{RETURNED}{shown} for inputs {PROBE_SHAPE}"
            continue
        runs.append(dtype)
    return tuple(runs), refused


def accelerator() -> str | None:
    """The device a kernel that refuses the CPU is inferred on: CUDA where it is here."""
    return "cuda" if torch.cuda.is_available() else None


def on_device(function, device: str):
    """``function`` computing on ``device`` whatever device its tensors come from: each is
    moved there, and what it returns moved back (``.to`` on both sides: gradients flow). Where
    the tensors are on ``device`` already (the checks on that device), it is ``function``."""
    @functools.wraps(function)
    def bridged(*args, **kwargs):
        home = next((a.device for a in args if isinstance(a, torch.Tensor)), None)

        def there(value):
            return value.to(device) if isinstance(value, torch.Tensor) else value

        def back(value):
            return value.to(home) if isinstance(value, torch.Tensor) and home else value

        result = function(*map(there, args), **{k: there(v) for k, v in kwargs.items()})
        return tuple(map(back, result)) if isinstance(result, tuple) else back(result)

    return bridged


def _slices_apart(function, axis: int, dtype: torch.dtype) -> bool | None:
    """Whether nudging the key/value inputs at index 0 of ``axis`` changes the output at that
    index alone; None when the function can't be called on these shapes."""
    generator = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(PROBE_SHAPE, generator=generator).to(dtype) for _ in range(3))
    try:
        with torch.no_grad():
            before = call_output(function(q, k, v))
            k2, v2 = k.clone(), v.clone()
            k2.select(axis, 0).add_(torch.randn(k2.select(axis, 0).shape,
                                                generator=generator).to(dtype))
            v2.select(axis, 0).add_(torch.randn(v2.select(axis, 0).shape,
                                                generator=generator).to(dtype))
            after = call_output(function(q, k2, v2))
    except Exception:  # the function's own shape checks: this layout is not its
        return None
    if before is None or after is None or before.shape != q.shape:
        return None
    others = [d for d in range(4) if d != axis]
    changed = ((after.double() - before.double()).abs().amax(dim=others)
               > unchanged_tolerance(dtype, before.double()))
    return bool(changed[0]) and not bool(changed[1:].any())


def function_layout(function, dtype: torch.dtype = torch.float32) -> tuple[str, str, Remedy]:
    """(layout, how it was decided, the declaration of the other) of a core function, by
    behaviour in ``dtype`` (see the module docstring); (B, H, L, D) where behaviour can't
    tell."""
    heads_second = _slices_apart(function, 1, dtype)
    heads_third = _slices_apart(function, 2, dtype)
    if heads_third and not heads_second:
        return "blhd", ("probed: slices along the third axis are independent (the heads), the "
                        "second axis mixes (the tokens)"), Remedy.to(
                            "layout", "bhld", "say the other was meant")
    if heads_second and not heads_third:
        return "bhld", ("probed: slices along the second axis are independent (the heads)"),\
            Remedy.to("layout", "blhd", "say the other was meant")
    return "bhld", "assumed: behaviour could not tell the heads' axis", Remedy.to(
        "layout", "blhd", "say it is (batch, length, heads, dim)")


def _names(dtypes) -> str:
    return ", ".join(dtype_name(d) for d in dtypes)


def _refusals(refused: dict[torch.dtype, str]) -> str:
    """"; refuses float32, float64 (why)": the refused dtypes grouped by their reason (the
    first's words; reasons that differ only in the dtype they name are one)."""
    reasons: dict[str, tuple[str, list[torch.dtype]]] = {}
    for dtype, why in refused.items():
        key = _DTYPE_WORDS.sub("<dtype>", why)
        reasons.setdefault(key, (why, []))[1].append(dtype)
    return "".join(f"; refuses {_names(dtypes)} ({why})" for why, dtypes in reasons.values())


RETURNED = "returned "
"""How a refusal by a wrong return (not an exception) opens."""


def _nowhere(label: str, refused: dict[torch.dtype, str]) -> InferenceError:
    """The one line for a function that runs in no dtype on this machine's CPU: a wrong return
    (in float32, or the first dtype tried) said as such (it runs; what it returns is no
    attention output), else the refusal."""
    first = next(iter(refused.values()))
    main = refused.get(torch.float32, first)
    if main.startswith(RETURNED):
        return InferenceError(
            f"{label} {main}: a kernel returns its output as a tensor of its query's shape and "
            "layout (or an (out, lse) pair)")
    where = ("and no CUDA device is here: a kernel that runs on CUDA only can't be checked on "
             "this machine" if accelerator() is None else
             f"nor on {accelerator()} in any dtype")
    return InferenceError(f"{label} runs nowhere here: on cpu it raises in every dtype "
                          f"({_names(refused)}; float32: {main}), {where}")


DROPOUT_TRIED = 0.5
"""The rate a kernel's dropout argument is tried at: one it raises on is refused (stated)."""


def forward_only(function, dtype: torch.dtype) -> str | None:
    """Why ``function`` is forward only, by behaviour, or None: with inputs that require
    gradients its output carries none (computed outside autograd), or its backward raises
    NotImplementedError. A backward that crashes otherwise is a bug, which the checks report."""
    generator = torch.Generator().manual_seed(29)
    q, k, v = (torch.randn(PROBE_SHAPE, generator=generator).to(dtype).requires_grad_(True)
               for _ in range(3))
    with torch.enable_grad():
        try:
            out = call_output(function(q, k, v))
        except NotImplementedError as error:  # FlexAttention on a CPU: no inputs needing grad
            return f"it raises {refusal(error)} for inputs that require gradients"
        if out is None or not out.requires_grad:
            return "its output carries no gradient (computed outside autograd)"
        try:
            out.float().sum().backward()
        except NotImplementedError as error:
            return f"its backward raises {refusal(error)}"
        except Exception:  # a crash in the backward: the checks' to report
            return None
    return None


def _declared_alignment(arguments: KernelArguments, aligned: CausalAlignment | None,
                        notes: list[str]) -> KernelArguments:
    """``arguments`` with the declared causal alignment, where one is, said beside the
    measured one: the declaration is the kernel's contract."""
    if aligned is None:
        return arguments
    measured = arguments.alignment
    differs = measured is not None and measured is not aligned
    notes.append(f"causal aligned {aligned.value.replace('_', '-')} (declared"
                 + (f"; measured {measured.value.replace('_', '-')}: kernel holds it to the "
                    "declaration" if differs else "") + ")")
    return replace(arguments, alignment=aligned)


def _form_notes(cls, cached: bool, grouped: bool) -> list[str]:
    """What the wrapper takes from the function's form: grouped heads, a cache, a dropout rate."""
    notes = []
    if grouped:
        notes.append("takes fewer key/value heads than query heads (probed: 4 query heads over "
                     "2 run): generated as divisors of the head count; kv_groups checks which "
                     "query head reads which")
    if cached:
        notes.append("a KV-cache kernel (k_cache, v_cache, k, v, cache_seqlens): checked as "
                     "dense attention, and by kv_cache decoding through the caches it writes")
    if cls.dropout_argument:
        notes.append(f"{cls.dropout_argument}: its dropout rate, given the configured one in "
                     "train mode and 0 in eval (checked by dropout)")
    return notes


@one_thread()  # its probes are tiny: threads only spin on a busy machine
def infer_function(function, *, name: str | None = None,
                   declared: Declarations | None = None) -> Inferred:
    """Declaration for a core function ``f(q, k, v[, mask][, causal])`` over per-head tensors:
    its dtypes probed (see the module docstring), its layout probed or declared, its keyword
    arguments inferred as a class's are."""
    label = name or getattr(function, "__name__", "core_function")
    declared = declared or Declarations()
    with declarations_read():
        stated = declared.choice("layout", tuple(LAYOUT_WORDS))
        wanted = declared.dtype_list()
        alignment = declared.choice("causal_alignment", ("bottom-right", "top-left"))
    aligned = CausalAlignment(alignment.replace("-", "_")) if alignment else None
    varlen = is_varlen(function)
    if varlen:  # checked through its dense view, (B, L, H, D) packed one sequence per element
        function, stated = dense_view(function), "blhd"
    interface = is_interface_function(function)
    if interface:  # called as a model calls it, through a kernel view over (B, H, L, D)
        function, stated = kernel_view(function), "bhld"
    core_function_class(function)  # the signature's own problem first, in one line
    runs, refused = dtype_probe(function)
    where, elsewhere = "cpu", ()
    if not runs:  # inferred where it runs: the accelerator, every probe bridged there
        device = None if is_cache_kernel(function) else accelerator()
        if device is None:
            raise _nowhere(label, refused)
        bridged = on_device(function, device)
        runs_there, refused_there = dtype_probe(bridged)
        if not runs_there:
            raise _nowhere(label, refused)
        main = refused.get(torch.float32, next(iter(refused.values())))
        elsewhere = (("cpu", f"it raises in every dtype there; float32: {main}"),)
        function, runs, refused, where = bridged, runs_there, refused_there, device
    probing = torch.float32 if torch.float32 in runs else runs[0]
    layout, how, remedy = ((stated, "varlen: packed tokens (total, heads, head_dim), a batch "
                                    "packed one sequence per element", None) if varlen else
                           (stated, INTERFACE_WORDS, None) if interface else
                           (stated, "declared", None) if stated
                           else function_layout(function, probing))
    grouped = takes_grouped(function, layout, probing)
    cached = is_cache_kernel(function)
    rate = next((n for n in inspect.signature(function).parameters if n in DROPOUT_ARGUMENTS),
                None)
    # A rate it raises on is its contract (FlashAttention builds without dropout): stated.
    dropout_refused = rate and refuses(function, layout, probing, rate, DROPOUT_TRIED)
    cls = (cache_function_class if cached else core_function_class)(
        function, layout, grouped, dropout=not dropout_refused)
    cls.page, pages = page_size(cls, probing) if cached else (None, None)
    cls.compute_dtype = None if probing is torch.float32 else probing
    try:
        inferred = infer(cls, name=label, declared=replace(declared, weights=OWN_WEIGHTS))
    finally:
        cls.compute_dtype = None
    note = Note(f"core function over {LAYOUT_WORDS[layout]} ({how}), wrapped in the suite's "
                "own q/k/v/out projections: every check applies to the function", remedy)
    arguments, found = kernel_arguments(function, layout, inferred.implementation.capabilities,
                                        probing)
    arguments = _declared_alignment(replace(arguments, varlen=varlen), aligned, found)
    forward = forward_only(function, probing)
    if forward is not None:
        found.append(f"forward only: {forward} (probed): the gradient checks skip")
    if wanted is None:
        dtypes = (f"runs in {_names(runs)} on {where} (probed: each is checked as its "
                  "contract; on another device, one it refuses there is stated by the gate and "
                  "left out)" + _refusals(refused)
                  + "".join(f"; refuses {device} ({why})" for device, why in elsewhere))
        # Probed here, so probed on every other device too: FlashAttention's kernel runs
        # float32 on a CPU and not on CUDA, where the gate states it and leaves it out.
        capabilities = replace(inferred.implementation.capabilities,
                               floats=Dtypes(supported=runs, assumed=(), probed=runs), kernel=arguments)
    else:
        dtypes = "dtypes " + _names(wanted) + " (declared)"
        capabilities = replace(inferred.implementation.capabilities, kernel=arguments)
    capabilities = replace(capabilities, forward_only=forward is not None,
                           refused_devices=elsewhere)
    found[:0] = _form_notes(cls, cached, grouped) + ([pages] if pages else []) + (
        [f"{rate}={DROPOUT_TRIED} {dropout_refused}: dropout is refused, a contract, not a "
         "failure: dropout is not checked"] if dropout_refused else [])
    # The wrapper's constructor, forward and projections are the suite's own: nothing to say,
    # and inference's dtype note is replaced by what the probe found.
    notes = (note, dtypes, *(n for n in inferred.notes[2:]
                             if not n.text.startswith(("weights from ", "dtypes ",
                                                  "float16 and bfloat16 assumed",
                                                  "key/value heads = num_kv_heads"))),
             *found)
    said = as_notes(notes)
    return Inferred(replace(inferred.implementation, notes=said, capabilities=capabilities), said)
