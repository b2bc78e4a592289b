"""Whether a replayed case is one a search draws: a case the suite printed replays in the search
that printed it, and every other search of a check, or of another check, asks for cases of its
own (masked, causal, longer than one token, shaped for the attention probe). A replayed case
that is not one of a search's is not run there, and the run says so: it is no verdict, and no
error of the suite's.

:func:`~conformance.generation.strategies.cases` records what each search asks for
(:class:`Drawn`) on the strategy it returns; :func:`misfit` reads a case against it.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from conformance.generation.cases import MAX_LEN, Case, dtype_name
from conformance.model.spec import Capabilities


@dataclass(frozen=True)
class Drawn:
    """What one search of :func:`~conformance.generation.strategies.cases` asks for: its
    keyword arguments, as that function reads them."""

    masks: str = "none"
    causal: bool = False
    cross: bool = True
    min_heads: int = 1
    min_len: int = 1
    probe: bool = False
    min_batch: int = 1
    dtypes: tuple[torch.dtype, ...] | None = None
    max_len: int | None = MAX_LEN
    max_batch: int = 4
    max_heads: int = 8
    grouped: bool = False

    @classmethod
    def asked(cls, keywords: dict[str, object]) -> Drawn:
        """What ``cases(caps, device, **keywords)`` asks for."""
        names = {field.name for field in fields(cls)}
        return cls(**{name: value for name, value in keywords.items() if name in names})


ANY = Drawn(masks="auto", max_len=None)
"""What any case of the implementation's is (a strategy of other cases than :func:`cases`'s,
a fixed case varied by its seed: a replayed case is held to the implementation alone)."""


def drawn_of(strategy: object) -> Drawn | None:
    """What a strategy of :func:`~conformance.generation.strategies.cases` asks for; None for
    another strategy. A filtered or mapped one is another lazy strategy of the same call, whose
    keywords hypothesis keeps (read there: ``tests/test_search_replays.py`` holds it to that)."""
    found = getattr(strategy, "drawn", None)
    if isinstance(found, Drawn):
        return found
    arguments = getattr(strategy, "_LazyStrategy__args", None)
    keywords = getattr(strategy, "_LazyStrategy__kwargs", None)
    if arguments and isinstance(arguments[0], Capabilities) and isinstance(keywords, dict):
        return Drawn.asked(keywords)
    return None


def misfit(case: Case, caps: Capabilities, drawn: Drawn) -> str | None:
    """Why ``case`` is not one a search asking ``drawn`` of ``caps`` draws, in words; None where
    it is."""
    causal = drawn.causal or caps.causality.kind == "always"
    masks = ("kept" if caps.mask is not None else "none") if drawn.masks == "auto" \
        else drawn.masks
    shortest = min(case.q_len, case.kv_len)
    reasons = [
        (case.kept is not None and masks == "none", "a mask, where it takes none here"),
        (case.kept is None and masks in ("partly_masked", "fully_masked"),
         "no mask, where it asks for masked keys"),
        (masks == "fully_masked" and case.kept is not None and 0 not in case.kept,
         "no fully masked row"),
        (causal and not case.causal, "no causality, where it is causal"),
        (case.causal and caps.causality.kind == "never", "causality, which it has not"),
        (case.q_len != case.kv_len and (causal or not drawn.cross or not caps.cross_attention),
         "fewer queries than keys"),
        (shortest < max(drawn.min_len, caps.min_len or 1),
         f"{shortest} token(s), fewer than {max(drawn.min_len, caps.min_len or 1)}"),
        (caps.max_len is not None and max(case.q_len, case.kv_len) > caps.max_len,
         f"more tokens than its {caps.max_len}"),
        (drawn.max_len is not None and max(case.q_len, case.kv_len) > drawn.max_len,
         f"more than {drawn.max_len} tokens"),
        (case.batch < drawn.min_batch, f"a batch under {drawn.min_batch}"),
        (case.num_heads < drawn.min_heads, f"fewer than {drawn.min_heads} heads"),
        (drawn.probe and case.kv_len > case.head_dim, "keys wider than a head (the probe's)"),
        (drawn.dtypes is not None and case.dtype not in map(dtype_name, drawn.dtypes),
         f"dtype {case.dtype}"),
        (drawn.grouped and case.kv_heads is None, "no grouped key/value heads"),
    ]
    found = [words for wrong, words in reasons if wrong]
    return None if not found else "it has " + "; ".join(found)
