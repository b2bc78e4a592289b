"""Autograd: gradients exist, are right, and never reach masked keys.

Property: backward runs; every parameter receives a gradient (where the data chooses the keys a
query sees, a top-k's indices, a parameter that only chooses gets none by design) and every
gradient is finite; the
query and value inputs (and the key input where a row has two keys to weigh) receive a non-zero
gradient wherever the output depends on them (an input the forward ignores at that size, as a
LayerNorm over one feature does, has the zero derivative); in float64 on tiny shapes, the backward
pass agrees with finite differences of the forward (for random directions d and cotangents c, <grad
of sum(c * f), d> equals the fourth-order central difference of t -> sum(c * f(x + t d)), at the
precision the implementation computes in, once that difference has converged: refined with smaller
steps where it disagrees, and judged only where two successive steps agree); and key/value inputs
at masked positions receive exactly zero gradient (for self-attention: with no gradient flowing
into the masked positions' own rows).

The finite-difference check is the suite's own, built from forward and backward calls through
the boundary, rather than ``torch.autograd.gradcheck`` run beside the implementation: an
implementation in another process (an untrusted one) can't answer for it.
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch
from hypothesis import strategies as st

from conformance.checks.diagnosis import Bug
from conformance.checks.invariants.base import Check, CheckContext, observed_normaliser
from conformance.checks.invariants.verify import fmt, revealing
from conformance.checks.invariants.violation import Violation
from conformance.generation.cases import Case
from conformance.generation.strategies import cases
from conformance.model.normaliser import NormaliserKind
from conformance.model.results import Hint
from conformance.model.spec import Capabilities
from conformance.model.weights import user_path
from conformance.numerics.tolerance import abs_error, only_rows, unchanged_tolerance, worst_index
from conformance.subject.boundary import Inputs, Instance

FD_DIRECTIONS = 3
FD_STEP = {torch.float64: 1e-3, torch.float32: 3e-2}
"""Finite-difference step per judged precision: the fourth-order stencil's truncation error
(~step^4) and its rounding error (~eps / step) balance far below the tolerance. Half precision
has none: its rounding of the shifted inputs and of the output (eps ~ 1e-3 against a step of
~0.1) leaves differences of small derivatives at the level of noise (a correct float16 kernel
measured 25% off on a 2-token case)."""
FD_RTOL = {torch.float64: 1e-6, torch.float32: 2e-3}
"""Allowed disagreement, relative to sum |c| |df| (the directional derivative's size without
cancellation). A wrong backward is off by a fraction of the gradient itself."""


def _shifted(inputs: Inputs, direction: dict[str, torch.Tensor], t: float) -> Inputs:
    moved = {name: getattr(inputs, "query" if name == "x" else name) + t * d
             for name, d in direction.items()}
    if inputs.is_self:
        return inputs.with_tensors(moved["x"])
    return inputs.with_tensors(*(moved.get(name, getattr(inputs, name))
                                 for name in ("query", "key", "value")))


REFINEMENTS = 4
"""Halvings of the step at most, where the first estimate disagrees with the backward: the
estimate is judged only once two successive steps agree (it has converged)."""


def _estimate(instance: Instance, inputs: Inputs, direction: dict[str, torch.Tensor],
              cotangent: torch.Tensor, step: float) -> tuple[float, float]:
    """The fourth-order central difference of t -> sum(c * f(x + t d)) at ``step``, and the
    directional derivative's size without cancellation (sum |c| |df|)."""
    # With autograd enabled: the function backward differentiates (a no-grad path that
    # computes something else is path_agreement's finding, not this one).
    values = {t: instance.forward(_shifted(inputs, direction, t * step), autograd=True).to(
        torch.float64).cpu() for t in (-2, -1, 1, 2)}
    phi = {t: float((cotangent * value).sum()) for t, value in values.items()}
    numeric = (phi[-2] - 8 * phi[-1] + 8 * phi[1] - phi[2]) / (12 * step)
    size = float((cotangent.abs() * (values[1] - values[-1]).abs()).sum()) / (2 * step)
    return numeric, size


def apart(first: float, second: float) -> tuple[str, str]:
    """Two numbers with the significant digits that show where they differ."""
    largest = max(abs(first), abs(second))
    gap = abs(first - second)
    digits = 3 if gap == 0 or largest == 0 else min(12, max(3, 2 - math.floor(
        math.log10(gap / largest))))
    return f"{first:.{digits}g}", f"{second:.{digits}g}"


def finite_difference_problem(instance: Instance, inputs: Inputs, case: Case,
                              judged: torch.dtype, only: str | None = None,
                              unsettled: list[str] | None = None) -> str | None:
    """Backward against central differences of forward, along FD_DIRECTIONS random directions;
    None when they agree at the ``judged`` precision (float64, or float32 for an implementation
    that computes part of attention in float32), else what disagreed. ``only`` moves that one
    input alone (its gradient, not drowned by the others').

    A difference that disagrees is refined (the step halved, up to REFINEMENTS times) until two
    successive estimates agree: only a converged estimate that disagrees is a problem. One that
    never settles (a nearly flat direction where truncation and rounding both matter) is no
    evidence either way: said in ``unsettled`` where given, and not judged."""
    step, rtol = FD_STEP[judged], FD_RTOL[judged]
    output = instance.forward(inputs, autograd=True)
    cotangent = case.tensor(*output.shape, stream=101)
    gradients = instance.gradients(inputs, cotangent).inputs
    c = cotangent.to(torch.float64).cpu()
    for k in range(FD_DIRECTIONS):
        direction = {name: case.tensor(*gradient.shape, stream=110 + 3 * k + i)
                     for i, (name, gradient) in enumerate(gradients.items())
                     if only is None or name == only}
        analytic = sum(float((gradients[name].to(torch.float64).cpu()
                              * d.to(torch.float64).cpu()).sum())
                       for name, d in direction.items())
        numeric, size = _estimate(instance, inputs, direction, c, step)
        allowed = rtol * max(size, abs(analytic)) + 1e-12
        if abs(numeric - analytic) <= allowed:
            continue
        used, converged = step, False
        for _ in range(REFINEMENTS):
            finer, _ = _estimate(instance, inputs, direction, c, used / 2)
            used /= 2
            converged = abs(finer - numeric) <= allowed / 4
            numeric = finer
            if converged or abs(numeric - analytic) <= allowed:
                break
        if abs(numeric - analytic) <= allowed:
            continue
        moved = f" of {only}" if only else ""
        if not converged:
            if unsettled is not None:
                unsettled.append(f"along random direction {k + 1}{moved} finite differences "
                                 f"did not settle (steps {step:g} to {used:g}): not judged there")
            continue
        shown, expected = apart(analytic, numeric)
        return (f"along random direction {k + 1}{moved}, backward gives a directional derivative "
                f"of {shown} where finite differences of forward give {expected} (converged "
                f"from step {step:g} to {used:g}; allowed difference {fmt(allowed)})")
    return None


@st.composite
def _tiny(draw, context: CheckContext) -> Case:
    return draw(cases(context.capabilities, context.device, dtypes=(torch.float64,), max_len=3,
                      max_batch=2, max_heads=2, max_head_dim=2,
                      masks="auto"))


NEVER_APPLIED = "never applied"
"""How a hint ends that measured a projection the output does not depend on."""


class Autograd(Check):
    """Backward runs; gradients reach every parameter and input, match finite differences, skip
    masked keys."""

    name = "autograd"
    order = 150
    applies = "a backward (not forward only)"
    title = ("gradients reach every parameter; backward matches finite differences; masked keys "
             "get exactly zero")

    def skip_reason(self, capabilities: Capabilities) -> str | None:
        if capabilities.forward_only:
            return "forward only (probed): no backward to check"
        return None

    def run(self, context: CheckContext) -> None:
        caps = context.capabilities
        # Every row has a key to attend to: fully masked rows are the fully_masked check's.
        strategy = cases(caps, context.device,
                         masks="partly_masked" if caps.mask is not None else "none").filter(
            lambda case: bool(case.attendable_rows().all()))
        context.explore(strategy, lambda case: self.verify(context, case))
        if torch.float64 in caps.floats.supported:
            context.explore(_tiny(context).filter(lambda case: bool(case.attendable_rows().all())),
                            lambda case: self.gradcheck(context, case), max_examples=5)

    def verify(self, context: CheckContext, case: Case) -> None:
        instance = context.build(case)
        inputs = case.inputs(context.capabilities.call)
        keep = inputs.keep
        rows = context.rows(case)
        if inputs.is_self and keep is not None:
            rows = rows & keep.cpu()  # a masked position's own row would carry gradient to it
        shape = (case.batch, case.q_len, case.d_model)
        cotangent = torch.where(rows.to(inputs.query.device)[:, :, None],
                                case.tensor(*shape, stream=71), 0.0)
        gradients = instance.gradients(inputs, cotangent)

        if gradients.unused:
            context.observe("parameters of submodules the forward never calls (not part of "
                            "attention, no gradient expected): "
                            + ", ".join(sorted(map(user_path, gradients.unused))))
        unused = set(gradients.unused)
        normaliser = observed_normaliser(context.capabilities)
        if normaliser is not None and normaliser.kind is NormaliserKind.SELECTED:
            # Indices a top-k or a router picks carry no gradient: what only chooses the keys
            # (DSA's indexer, trained by a loss of its own) gets none by design.
            chosen = {name for name, gradient in gradients.parameters.items()
                      if gradient is None} - unused
            if chosen:
                context.observe("parameters that receive no gradient while the keys each query "
                                "sees are chosen by the data (observed): a choice carries none, "
                                "so they only choose: " + ", ".join(sorted(map(user_path, chosen))))
                unused |= chosen
        for name, gradient in gradients.parameters.items():
            if gradient is None and name in unused:
                continue
            if gradient is None:
                hint = context.hint(lambda name=name: self._no_gradient(context, case, instance,
                                                                        inputs, name))
                # A declared projection counts even when the forward never calls it: say that
                # it runs only where that was not measured otherwise.
                runs = "" if hint and hint.endswith(NEVER_APPLIED) else (
                    ", though its submodule runs in the forward")
                raise Violation(f"parameter {user_path(name)} receives no gradient{runs}",
                                hint=hint)
            if not bool(torch.isfinite(gradient).all()):
                raise Violation(f"the gradient of parameter {user_path(name)} is not finite")
        for name, gradient in gradients.inputs.items():
            if not bool(torch.isfinite(gradient).all()):
                raise Violation(f"the gradient with respect to input {name} is not finite")

        # With one key to attend to the softmax weight is 1 whatever q and k are: their gradient
        # is legitimately zero. The values (and x) always matter.
        weighing = int(case.kv_len if keep is None else keep.sum(-1).max()) >= 2
        needed = [n for n in gradients.inputs if n not in ("query", "key") or weighing]
        for name in needed:
            if float(gradients.inputs[name].abs().max()) == 0.0 and bool(rows.any()):
                if not self._depends(context, case, instance, inputs, name):
                    # Its derivative is zero: the forward ignores it at this size (a LayerNorm
                    # over one feature, Perceiver's at width 1). What ignores an input it
                    # should read is the reference checks' finding, not the backward's.
                    context.observe(f"the output does not depend on input {name} at "
                                    f"d_model {case.d_model}: its zero gradient is its derivative")
                    continue
                raise Violation(f"no gradient reaches input {name}",
                                hint=f"the output depends on {name}, yet no gradient reaches it: "
                                     "is it detached (.detach(), torch.no_grad())?")

        if keep is None:
            return
        masked = (~keep).cpu()[:, :, None]
        for name in ("key", "value", "x"):
            if name not in gradients.inputs:
                continue
            leak = torch.where(masked, gradients.inputs[name].abs().to(torch.float64).cpu(), 0.0)
            if float(leak.max()) != 0.0:
                b, position, _ = worst_index(leak)
                raise Violation(
                    f"input {name} at masked position {position} of batch {b} receives gradient "
                    f"{fmt(float(leak[b, position].max()))}, not exactly 0",
                    hint=context.hint(lambda: self._forward_leaks(context, case, instance,
                                                                  inputs)))

    @staticmethod
    def _changes(context: CheckContext, case: Case, instance: Instance, inputs: Inputs,
                 output: torch.Tensor) -> bool:
        """Whether ``instance`` on ``inputs`` gives another output than ``output``."""
        other = context.run(instance, inputs, case)
        tolerance = unchanged_tolerance(context.judged(output.dtype), output)
        return float(only_rows(abs_error(other, output), context.rows(case)).max()) > tolerance

    def _no_gradient(self, context: CheckContext, case: Case, instance: Instance,
                     inputs: Inputs, name: str) -> str | None:
        """Why parameter ``name`` gets no gradient, where measured with weight access: a
        projection whose weights don't change the output is never applied; where every
        projection's do, a parameter without gradient is cut from the graph. Measured on
        ``case``, or where its rows have one key each (the softmax then ignores q and k), on
        its revealing case."""
        if not context.capabilities.weights:
            return None
        keep = inputs.keep
        if int(case.kv_len if keep is None else keep.sum(-1).min()) < 2:
            shown = revealing(context.capabilities, case)
            if shown is None or shown.kv_len < 2:
                return None
            case, instance = shown, context.build(shown)
            inputs = case.inputs(context.capabilities.call)
        weights = instance.read_weights()
        output = context.run(instance, inputs, case)
        roles = {"query": "w_q", "key": "w_k", "value": "w_v", "output": "w_o"}
        unused = []
        for role, field in roles.items():
            weight = getattr(weights, field)
            if weight is None:
                continue
            instance.write_weights(replace(weights, **{field: weight * 2.0}))
            if not self._changes(context, case, instance, inputs, output):
                unused.append(role)
        instance.write_weights(weights)
        if unused:
            # The output projection alone: the bug the reference's diagnosis names too.
            kind = Bug.OUTPUT_PROJECTION_SKIPPED.value if unused == ["output"] else None
            return Hint(f"the output does not change when the {' and '.join(unused)} "
                        f"projection's weights do: {'it is' if len(unused) == 1 else 'they are'} "
                        f"{NEVER_APPLIED}", kind)
        return (f"every projection's weights change the output, yet {name} receives no gradient: "
                "is it detached (.detach(), torch.no_grad())?")

    def _depends(self, context: CheckContext, case: Case, instance: Instance,
                 inputs: Inputs, name: str) -> bool:
        """Whether the output changes with input ``name`` (an input without gradient is then
        cut from the graph; otherwise its zero gradient is the derivative)."""
        output = context.run(instance, inputs, case)
        if name == "x":
            changed = inputs.with_tensors(inputs.query * 2.0 + 0.5)
        else:
            tensors = {n: getattr(inputs, n) for n in ("query", "key", "value")}
            tensors[name] = tensors[name] * 2.0 + 0.5
            changed = inputs.with_tensors(tensors["query"], tensors["key"], tensors["value"])
        return self._changes(context, case, instance, changed, output)

    def _forward_leaks(self, context: CheckContext, case: Case, instance: Instance,
                       inputs: Inputs) -> str | None:
        """A pointer to the padding check where the forward itself depends on the masked
        positions (the gradient leak is that leak); else None: nothing measured names a
        cause."""
        output = context.run(instance, inputs, case)
        changed = case.replace_positions(inputs, ~inputs.keep, stream=11, scale=10.0)
        if self._changes(context, case, instance, changed, output):
            return "the forward already depends on the masked positions (see padding)"
        return None

    def gradcheck(self, context: CheckContext, case: Case) -> None:
        judged = context.judged(case.config.dtype)
        unsettled: list[str] = []
        problem = finite_difference_problem(context.build(case),
                                            case.inputs(context.capabilities.call), case, judged,
                                            unsettled=unsettled)
        for words in unsettled:
            context.observe(f"finite differences: {words}")
        if problem is not None:
            raise Violation(f"in float64 the backward pass disagrees with the forward's finite "
                            f"differences: {problem}",
                            hint="a custom backward, an in-place op or a detach in the graph?")
