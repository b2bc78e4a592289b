"""Limits met inside a check: configurations an implementation refuses that the gate's probe did
not try, found by re-probing them as the gate would.

A call that raises inside a check, at a configuration (what the module is built for: heads,
widths, key/value heads, window, dtype) the gate never built, is either the inputs' fault or the
configuration's. The configuration is built again and called without a mask on two small shapes:
where every call fails too, it is a limit of the implementation, like a constructor refusing it
(the case is no example, and the check says so); where the calls run, the error stays a failure.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from conformance.generation.cases import Case, dtype_name, own_queries
from conformance.model.spec import Capabilities, Config
from conformance.subject.boundary import ImplementationError

REFUSED = "refuses "
"""How the observation listing the configurations a check found refused begins."""

SHAPES = ((2, 5), (3, 3))
"""(batch, length) of the re-probe's calls: the gate's basic shapes."""


def limit_key(case: Case) -> Config:
    """What the module is built for, without the inputs' sizes (batch, lengths)."""
    return replace(case.config, batch=0, q_len=0, kv_len=0)


def configuration_words(config: Config) -> str:
    kv = f", {config.num_kv_heads} key/value head(s)" if config.num_kv_heads is not None else ""
    window = f", window {config.window}" if config.window is not None else ""
    return f"{config.num_heads} head(s) of {config.head_dim}{kv}{window} in {dtype_name(config.dtype)}"


def unfit_words(shapes: tuple[tuple[int, int], ...] | None) -> str:
    """Why a search found no case at all: none it needs fits the (num_heads, head_dim) pairs
    the implementation builds for."""
    built = ("" if shapes is None else " (" + ", ".join(
        f"{heads} head(s) of {head_dim}" for heads, head_dim in shapes[:4])
        + (", ..." if len(shapes) > 4 else "") + ")")
    return f"no case it needs fits the configurations the implementation builds for{built}"


@dataclass
class ConfigurationLimits:
    """The configurations re-probed for one implementation on one device: the error every call
    gives there, or None where the configuration runs (the error was the inputs')."""

    probed: dict[Config, str | None] = field(default_factory=dict)

    def known(self, case: Case) -> bool:
        """Whether ``case``'s configuration is already known to be refused."""
        return bool(self.probed.get(limit_key(case)))

    def probe(self, case: Case, call: Callable[[Case], object], caps: Capabilities) -> bool:
        """Whether ``case``'s configuration is refused: ``call`` (build and call once, raising
        ImplementationError where that fails) fails on both of the gate's shapes there."""
        key = limit_key(case)
        if key not in self.probed:
            problems = []
            for batch, length in SHAPES:
                length = caps.length_near(length)
                try:
                    call(own_queries(replace(case, batch=batch, q_len=length, kv_len=length,
                                             kept=None, mask_seed=None, shared_mask=False,
                                             seed=batch), caps))
                except ImplementationError as error:
                    if error.fatal:
                        raise
                    problems.append(str(error))
                else:
                    break
            self.probed[key] = problems[0][:160] if len(problems) == len(SHAPES) else None
        return bool(self.probed[key])

    def refused(self, keys: list[Config]) -> list[str]:
        """The refusals of the configurations ``keys``, in words: a check's own, whichever
        check probed them first (so its verdict does not depend on the order checks run in)."""
        return sorted({words for key in keys if (words := self.probed.get(key))})

    def note(self, keys: list[Config]) -> str:
        """The observation for the configurations ``keys`` a check found refused."""
        first = keys[0]
        return (f"{REFUSED}{len(keys)} configuration(s) the gate's probe did not try, e.g. "
                f"{configuration_words(first)} ({self.probed[first]}): every call fails there, "
                "with or without a mask, so cases there are left out (a limit, as for a "
                "constructor that refuses them)")
