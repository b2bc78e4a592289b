"""The catalogue inside a user's own test file, the way scikit-learn's ``parametrize_with_checks``
works::

    from conformance.testing import parametrize_with_checks
    from mypackage import MyAttention

    @parametrize_with_checks(MyAttention)            # a class (inferred) or an Implementation
    def test_my_attention(attention_check):
        attention_check()

One test per (implementation, check, device), with ids such as ``MyAttention-padding``; a check
the implementation can't take part in is skipped, an expected failure is an xfail.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pytest

from conformance.adapter import InProcessSubject, Subject
from conformance.catalogue import CHECK_NAMES, Runner
from conformance.expectations import apply
from conformance.inference import DeclarationError, InferenceError, infer
from conformance.inference.declarations import from_mapping, from_pyproject, merged
from conformance.pytest_catalogue import enforce
from conformance.pytest_plugin import pasteable_id
from conformance.spec import Implementation


@dataclass
class AttentionCheck:
    """One check of one implementation on one device; call it inside the test."""

    subject: Subject
    check: str
    device: str
    runner: Runner

    def __call__(self) -> None:
        enforce(self.runner.run_check(self.subject, self.check, self.device))


def parametrize_with_checks(*targets: type | Implementation, profile: str = "quick",
                            devices: Sequence[str] = ("cpu", "cuda"),
                            checks: Sequence[str] | None = None,
                            expected_failures: Mapping[str, Mapping[str, str]] | None = None,
                            strict: bool = False,
                            declare: Mapping[str, object] | None = None):
    """A ``pytest.mark.parametrize`` over every check of every target, as ``attention_check``.

    ``targets`` are ``nn.Module`` classes (their interface is inferred) or declared
    Implementations; ``expected_failures`` is ``{implementation: {check: reason}}``. A warning
    passes the test and shows in pytest's warnings summary; ``strict`` fails on it.
    ``declare`` overrides inference for the classes, with the spellings of the command line's
    declarations and of ``pyproject.toml`` (``{"mask": "ignore_bool:key_padding@key_padding_mask",
    "kv-grouping": "tiled"}``), over what ``pyproject.toml`` declares for
    ``module:Class``.
    """
    try:
        stated = from_mapping(dict(declare or {}), "parametrize_with_checks(declare=...)")
        implementations = [
            t if isinstance(t, Implementation) else infer(t, declared=merged(
                from_pyproject(f"{t.__module__}:{t.__qualname__}"), stated)).implementation
            for t in targets]
    except (DeclarationError, InferenceError) as error:
        raise pytest.UsageError(f"attention-conformance: {error}") from error
    implementations = apply(implementations, expected_failures or {})
    runner = Runner(profile, strict=strict)  # one gate per implementation and device
    params = [
        pytest.param(AttentionCheck(InProcessSubject(impl), name, device, runner),
                     id=f"{pasteable_id(impl.name)}-{name}" + ("" if device == "cpu" else f"-{device}"))
        for impl in implementations for device in devices for name in (checks or CHECK_NAMES)
    ]
    return pytest.mark.parametrize("attention_check", params)
