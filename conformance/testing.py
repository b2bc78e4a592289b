"""The catalogue inside a user's own test file, the way scikit-learn's ``parametrize_with_checks``
works::

    from conformance.testing import parametrize_with_checks
    from mypackage import MyAttention, my_attention_kernel

    @parametrize_with_checks(MyAttention, my_attention_kernel,
                             declare={"mask": "ignore_bool:key_padding@key_padding_mask"})
    def test_my_attention(attention_check):
        attention_check()

One test per (implementation, check, device), with ids such as ``MyAttention-padding``; a check
the implementation can't take part in is skipped, an expected failure is an xfail. Targets are
what the command line takes: classes (inferred), instances (through their class), core attention
functions, declared Implementations, registered names and IMPL strings; ``declare`` takes the
command line's declarations in their TOML spellings, over what ``pyproject.toml`` declares. The
search follows the pytest run's options (``--attention-profile``, ``--hypothesis-profile``,
``--hypothesis-seed``, ``--hypothesis-verbosity``, ``--attention-strict``,
``--attention-replay``) unless given here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import pytest

from conformance.frontends.interface_language import error_words
from conformance.frontends.pytest_catalogue import enforce, reproduction
from conformance.frontends.pytest_options import current_config, pasteable_id, run_options
from conformance.inference import DeclarationError
from conformance.loading.registry import ResolveError, implementations_of
from conformance.model.check_names import CHECK_NAMES, unknown_checks
from conformance.model.declaration_sources import from_mapping
from conformance.model.expectations import apply
from conformance.run.options import RunOptions
from conformance.run.runner import Runner
from conformance.subject.boundary import Subject
from conformance.subject.in_process import InProcessSubject

_RUNNERS: dict[tuple, Runner] = {}
"""One Runner per set of options, so every check of an implementation shares its gate."""


@dataclass
class AttentionCheck:
    """One check of one implementation on one device; call it inside the test."""

    subject: Subject
    check: str
    device: str
    profile: str | None
    strict: bool | None

    def __call__(self) -> None:
        enforce(self.runner().run_check(self.subject, self.check, self.device), reproduction(),
                interface="python")

    def runner(self) -> Runner:
        """The Runner for the pytest run's options, with what the decorator fixed over them."""
        config = current_config()
        if config is None:  # called outside pytest
            options = RunOptions(self.profile or "quick", strict=bool(self.strict))
        else:
            try:
                options = run_options(config)
            except ValueError as error:
                raise pytest.UsageError(f"attention-conformance: {error}") from error
            if self.profile is not None:
                options = replace(options, profile=self.profile)
            if self.strict is not None:
                options = replace(options, strict=self.strict)
        # The example database is one object per directory (not hashable): keyed by identity.
        key = (id(config), replace(options, database=None), id(options.database))
        if key not in _RUNNERS:
            try:
                _RUNNERS[key] = Runner.of(options)
            except ValueError as error:
                if config is None:
                    raise
                raise pytest.UsageError(f"attention-conformance: {error}") from error
        return _RUNNERS[key]


def parametrize_with_checks(*targets: object, profile: str | None = None,
                            devices: Sequence[str] = ("cpu", "cuda"),
                            checks: Sequence[str] | None = None,
                            expected_failures: Mapping[str, Mapping[str, str]] | None = None,
                            strict: bool | None = None,
                            declare: Mapping[str, object] | None = None):
    """A ``pytest.mark.parametrize`` over every check of every target, as ``attention_check``.

    ``targets`` are what ``attention-conformance check`` takes (see the module's docstring);
    ``expected_failures`` is ``{implementation: {check: reason}}``. A warning passes the test
    and shows in pytest's warnings summary; ``strict`` fails on it. ``profile`` and ``strict``
    default to the pytest run's (``--attention-profile``, ``--attention-strict``). ``declare``
    overrides inference for the classes and functions, with the spellings of the command line's
    declarations and of ``pyproject.toml`` (``{"mask": "ignore_bool:key_padding@key_padding_mask",
    "kv-grouping": "tiled"}``), over what the nearest ``pyproject.toml`` declares for them. An
    unknown check name (in ``checks`` or ``expected_failures``) is an error with a suggestion.
    """
    named = list(checks or CHECK_NAMES)
    problem = unknown_checks([*named, *(check for table in (expected_failures or {}).values()
                                        for check in table)])
    if problem:
        raise pytest.UsageError(f"attention-conformance: parametrize_with_checks: {problem}")
    try:
        stated = from_mapping(dict(declare or {}), "parametrize_with_checks(declare=...)")
        implementations = [impl for target in targets
                           for impl in implementations_of(target, stated)]
    except (DeclarationError, ResolveError) as error:
        raise pytest.UsageError(
            f"attention-conformance: {error_words(error, 'python')}") from error
    implementations = apply(implementations, expected_failures or {})
    params = [
        pytest.param(AttentionCheck(InProcessSubject(impl), name, device, profile, strict),
                     id=f"{pasteable_id(impl.name)}-{name}" + ("" if device == "cpu"
                                                               else f"-{device}"))
        for impl in implementations for device in devices for name in named
    ]
    return pytest.mark.parametrize("attention_check", params)
