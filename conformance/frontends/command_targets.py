"""The command line's IMPL arguments, resolved to implementations to check in this process, and
:class:`~conformance.frontends.exit_codes.UsageError`, the command line's bad input (one line,
exit status 2).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from conformance.frontends.exit_codes import UsageError
from conformance.frontends.interface_language import error_words
from conformance.loading.model_names import is_pattern, model_names
from conformance.loading.registry import ResolveError, registered, resolve
from conformance.model import expectations
from conformance.model.declarations import Declarations
from conformance.model.spec import Implementation
from conformance.run.isolated import BadInput, preflight
from conformance.subject.in_process import InProcessSubject


def resolved_targets(specs: Sequence[str], expected: tuple[dict, dict] = ({}, {}),
                     declared: Declarations | None = None) -> list[tuple[str, Implementation]]:
    """Each implementation to check in this process, with the IMPL string that resolves to it
    (every registered one, with no IMPL; each model a ``transformers:PATTERN`` names)."""
    if len(specs) == 1 and is_pattern(specs[0]):
        return each_model(specs[0], expected, declared)
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



def each_model(spec: str, expected: tuple[dict, dict], declared: Declarations | None
               ) -> list[tuple[str, Implementation]]:
    """The targets of every model class the pattern ``spec`` names; a model that can't be
    checked (built, run, found attention in) is one line on stderr as it is met, and the others
    go on."""
    names = model_names(spec)
    if not names:
        raise UsageError(f"{spec}: the pattern names no transformers model class (its causal "
                         "LMs, base models, encoder-decoders, masked LMs, image classifiers)")
    targets: list[tuple[str, Implementation]] = []
    unchecked = []
    for name in names:
        try:
            targets += resolved_targets([name], expected, declared)
        except UsageError as error:
            unchecked.append(f"not checked: {error}")
            print(unchecked[-1], file=sys.stderr)
    if not targets:
        raise UsageError(f"{spec}: none of the {len(names)} model(s) it names could be checked")
    if unchecked:
        print(f"{len(unchecked)} of the {len(names)} model(s) {spec} names not checked (each "
              "said above)", file=sys.stderr)
    return targets
