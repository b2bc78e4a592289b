"""The command line's IMPL arguments, resolved to implementations to check in this process, and
:class:`~conformance.frontends.exit_codes.UsageError`, the command line's bad input (one line,
exit status 2).
"""

from __future__ import annotations

from collections.abc import Sequence

from conformance.frontends.exit_codes import UsageError
from conformance.frontends.interface_language import error_words
from conformance.loading.registry import ResolveError, registered, resolve
from conformance.model import expectations
from conformance.model.declarations import Declarations
from conformance.model.spec import Implementation
from conformance.run.isolated import BadInput, preflight
from conformance.subject.in_process import InProcessSubject


def resolved_targets(specs: Sequence[str], expected: tuple[dict, dict] = ({}, {}),
                     declared: Declarations | None = None) -> list[tuple[str, Implementation]]:
    """Each implementation to check in this process, with the IMPL string that resolves to it
    (every registered one, with no IMPL)."""
    try:
        targets = ([(spec, impl) for spec in specs for impl in resolve(spec, declared)] if specs
                   else [(name, impl) for name, impl in registered().items()])
        targets = list(zip([spec for spec, _ in targets],
                           expectations.apply([impl for _, impl in targets], *expected),
                           strict=True))
    except ResolveError as error:
        raise UsageError(error_words(error, "cli")) from error
    if not targets:
        raise UsageError("no implementation to check: name one, or register one")
    try:
        for _, impl in targets:
            preflight(InProcessSubject(impl))
    except BadInput as error:
        raise UsageError(error_words(error, "cli")) from error
    return targets
