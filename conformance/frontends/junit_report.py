"""The run as JUnit XML (``check --junit-xml``): what GitLab, Jenkins and GitHub's test viewers
read, in the schema pytest's own ``--junitxml`` is held to (``junit-10.xsd``).

One testcase per check and device, named ``check[device]`` in the implementation's class: a
failure carries its reason as the message and its evidence (details, likely bug, minimal case,
the command that replays it) as the text; a suite error is an ``error``; a skip, and an expected
failure (as pytest writes an xfail), are ``skipped``; a warning passes (JUnit has no warnings),
saying itself in ``system-out``, which the viewers show.
"""

from __future__ import annotations

import datetime
import socket
import xml.etree.ElementTree as ElementTree
from collections.abc import Sequence

from conformance.frontends.report import Reproduction
from conformance.model.results import CheckResult, Status


def render_junit(results: Sequence[CheckResult], *, seconds: float,
                 reproduce: Reproduction | None = None) -> str:
    """The XML document (UTF-8 text)."""
    counts = {
        "tests": len(results),
        "failures": sum(r.status is Status.FAILED for r in results),
        "errors": sum(r.status is Status.SUITE_ERROR for r in results),
        "skipped": sum(r.status in (Status.SKIPPED, Status.EXPECTED_FAILURE) for r in results),
    }
    totals = {key: str(value) for key, value in counts.items()}
    # The schema's testsuites has no "skipped" (its testsuite has).
    suites = ElementTree.Element("testsuites", name="attention-conformance",
                                 time=f"{seconds:.3f}",
                                 **{k: v for k, v in totals.items() if k != "skipped"})
    suite = ElementTree.SubElement(
        suites, "testsuite", name="attention-conformance", time=f"{seconds:.3f}",
        timestamp=datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        hostname=socket.gethostname(), **totals)
    for result in results:
        case = ElementTree.SubElement(suite, "testcase", classname=result.implementation,
                                      name=f"{result.check}[{result.device}]",
                                      time=f"{result.seconds:.3f}")
        evidence = _evidence(result, reproduce)
        if result.status is Status.FAILED:
            ElementTree.SubElement(case, "failure", message=result.reason,
                                   type="conformance").text = evidence
        elif result.status is Status.SUITE_ERROR:
            ElementTree.SubElement(case, "error", message=result.reason,
                                   type="suite error").text = evidence
        elif result.status is Status.SKIPPED:
            ElementTree.SubElement(case, "skipped", message=result.reason, type="skip")
        elif result.status is Status.EXPECTED_FAILURE:
            ElementTree.SubElement(case, "skipped", message=f"expected failure: {result.reason}",
                                   type="xfail").text = evidence
        elif result.status is Status.WARNED:
            ElementTree.SubElement(case, "system-out").text = (f"warning: {result.reason}\n"
                                                               + evidence)
    ElementTree.indent(suites)
    return ('<?xml version="1.0" encoding="utf-8"?>\n'
            + ElementTree.tostring(suites, encoding="unicode") + "\n")


def _evidence(result: CheckResult, reproduce: Reproduction | None) -> str:
    lines = [result.reason]
    if result.hint:
        lines.append(f"likely bug: {result.hint}")
    lines += result.details
    if result.counterexample:
        lines.append(f"minimal case: {result.counterexample}")
        command = reproduce(result) if reproduce is not None else None
        if command:
            lines.append(f"replay it: {command}")
    return "\n".join(lines)
