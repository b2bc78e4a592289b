"""What resolving a target raises: one line for the user."""

from __future__ import annotations

from conformance.errors import ConformanceError


class ResolveError(ConformanceError):
    """An IMPL argument that names nothing checkable; the message is one line for the user."""


class MissingPackage(ResolveError):
    """The code imports a package this environment does not have (not one of its own modules):
    the environment's problem, to be installed, not the code's."""

    def __init__(self, message: str, package: str) -> None:
        super().__init__(message)
        self.package = package
