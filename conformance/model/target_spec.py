"""What a check is pointed at, said once: the text a user writes, parsed into one typed value
that the front ends, the registry, the worker and grading read.

- ``path/to/attention.py::MHA``: a name in a file (:attr:`TargetForm.FILE`);
- ``package.attention:MHA``, ``transformers:LlamaForCausalLM``: a name in a module
  (:attr:`TargetForm.MODULE`);
- ``sdpa``, ``mutant-mask-inverted``: a registered name (:attr:`TargetForm.REGISTERED`).

Standard library only: the command's entry reads it before anything heavy is imported.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from pathlib import Path


class TargetForm(str, Enum):
    """How a target names its code."""

    FILE = "file"
    """``path.py::Name``: a name in a file, loaded from its path."""
    MODULE = "module"
    """``package.module:Name``: a name in an importable module."""
    REGISTERED = "registered"
    """A name registered with ``@conformance.implementation`` or an entry point."""


WILDCARDS = frozenset("*?[")
"""The shell-style wildcards of a pattern (see :attr:`TargetSpec.pattern`)."""


@dataclass(frozen=True)
class TargetSpec:
    """One target: the ``text`` as written, its ``form``, where its code is (``location``: the
    file's path or the module's dotted name; empty for a registered name) and the name in it
    (``attribute``; the registered name itself)."""

    text: str
    form: TargetForm
    location: str
    attribute: str

    @classmethod
    def parse(cls, text: str) -> TargetSpec:
        """The target ``text`` names (``::`` follows a file, ``:`` a module, neither a registered
        name)."""
        if "::" in text:
            location, _, attribute = text.partition("::")
            return cls(text, TargetForm.FILE, location, attribute)
        if ":" in text:
            location, _, attribute = text.partition(":")
            return cls(text, TargetForm.MODULE, location, attribute)
        return cls(text, TargetForm.REGISTERED, "", text)

    @classmethod
    def in_file(cls, path: str | Path, attribute: str) -> TargetSpec:
        """The target of ``attribute`` in the file at ``path``."""
        return cls.parse(f"{path}::{attribute}")

    @property
    def pattern(self) -> bool:
        """Whether it names several classes of a module by wildcards
        (``transformers:*ForCausalLM``): each is a target of its own."""
        return self.form is TargetForm.MODULE and bool(WILDCARDS & set(self.attribute))

    @property
    def located(self) -> bool:
        """Whether it names code by where it lives (loadable again in another process); a
        pattern names several, each resolved on its own."""
        return self.form is not TargetForm.REGISTERED and not self.pattern

    @property
    def file(self) -> Path | None:
        """The file a FILE target names."""
        return Path(self.location) if self.form is TargetForm.FILE else None

    @property
    def package(self) -> str | None:
        """The top-level package a MODULE target imports first (``transformers``)."""
        return self.location.split(".")[0] if self.form is TargetForm.MODULE else None

    @property
    def origin(self) -> str:
        """The name an undeclared implementation gets: the file's name or the module's last
        part, and the attribute (``attention.py::MHA``, ``attention:MHA``)."""
        if self.form is TargetForm.FILE:
            return f"{Path(self.location).name}::{self.attribute}"
        if self.form is TargetForm.MODULE:
            return f"{self.location.rsplit('.', 1)[-1]}:{self.attribute}"
        return self.text

    def misformed(self) -> str | None:
        """Why a module target names a file (``attention.py:MHA``, whose ``:`` follows a module):
        one line saying how to write it; None where it is well formed."""
        if self.form is not TargetForm.MODULE:
            return None
        if self.location.endswith(".py") or "/" in self.location or "\\" in self.location:
            return (f"{self.location} is a file: name what is in it with '::' "
                    f"({self.location}::{self.attribute or 'NAME'}); ':' follows a module "
                    "(package.module:NAME)")
        return None

    @staticmethod
    def looks_located(argument: str) -> bool:
        """Whether a command-line word names code where it lives: a file (``path.py``,
        ``path.py::Name``) or a dotted module (``pkg.mod:Name``); an option's value such as
        ``keep_bool:broadcast`` does not (a top-level ``mod:Name`` is not told apart)."""
        target = TargetSpec.parse(argument)
        return (target.form is TargetForm.FILE or argument.endswith(".py")
                or (target.form is TargetForm.MODULE and "." in target.location))

    def __str__(self) -> str:
        return self.text
