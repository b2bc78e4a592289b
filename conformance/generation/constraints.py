"""Constructor constraints: the configurations an implementation agrees to be built for.

Some correct modules reject part of the generated configurations, in their constructor or only
when the forward runs (RoPE needs an even head_dim; grouped-query attention needs the head count
divisible by its key/value heads; a layout that changes form at one head). Building every
(num_heads, head_dim) pair the strategies draw from, and calling it once, finds which ones it
accepts; generation is then restricted to those, and the report states the rule in words. A
module is failed for this only when nothing builds and runs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from itertools import combinations

HEAD_COUNTS = (1, 2, 3, 4, 5, 6, 7, 8)
HEAD_DIMS = tuple(range(1, 17))

Pair = tuple[int, int]


@dataclass(frozen=True)
class Rule:
    """One recognisable constraint on (num_heads, head_dim), in words."""

    words: str
    holds: Callable[[int, int], bool]


def _rules() -> list[Rule]:
    rules = [Rule("an even head_dim", lambda h, d: d % 2 == 0)]
    rules += [Rule(f"head_dim a multiple of {k}", lambda h, d, k=k: d % k == 0)
              for k in (3, 4, 8)]
    rules += [Rule(f"num_heads a multiple of {k}", lambda h, d, k=k: h % k == 0)
              for k in (2, 3, 4, 8)]
    rules += [Rule(f"d_model = num_heads x head_dim a multiple of {k}",
                   lambda h, d, k=k: (h * d) % k == 0) for k in (2, 4, 8, 16)]
    rules += [Rule(f"head_dim >= {k}", lambda h, d, k=k: d >= k) for k in (2, 4, 8)]
    rules += [Rule(f"num_heads >= {k}", lambda h, d, k=k: h >= k) for k in (2, 3, 4)]
    rules += [Rule(f"num_heads <= {k}", lambda h, d, k=k: h <= k) for k in (1, 2, 4)]
    rules += [Rule(f"d_model <= {k}", lambda h, d, k=k: h * d <= k) for k in (16, 32, 64)]
    return rules


RULES = _rules()


@dataclass(frozen=True)
class Constraint:
    """The (num_heads, head_dim) pairs an implementation builds for, and the rule in words."""

    pairs: tuple[Pair, ...]
    words: str

    def describe(self) -> str:
        return f"builds and runs only with {self.words}: generating those configurations"


def describe(allowed: set[Pair], grid: Iterable[Pair]) -> str:
    """The simplest rule (one, or two together) that gives exactly ``allowed`` on ``grid``."""
    grid = list(grid)
    for size in (1, 2):
        for chosen in combinations(RULES, size):
            if {p for p in grid if all(rule.holds(*p) for rule in chosen)} == allowed:
                return " and ".join(rule.words for rule in chosen)
    heads = sorted({h for h, _ in allowed})
    dims = sorted({d for _, d in allowed})
    return (f"{len(allowed)} of the {len(grid)} (num_heads, head_dim) pairs (num_heads in "
            f"{heads}, head_dim in {dims})")


def discover(builds: Callable[[int, int], bool], *, heads: int | None = None,
             base: Pair = (2, 4)) -> Constraint | None:
    """Which (num_heads, head_dim) pairs ``builds`` accepts; None when all of them do.

    ``heads`` fixes the head count (single-head modules). A quick pass builds one row and one
    column of the grid through ``base``; only if something there fails is every pair tried.
    Raises ValueError when nothing builds.
    """
    head_counts = (heads,) if heads is not None else HEAD_COUNTS
    grid = [(h, d) for h in head_counts for d in HEAD_DIMS]
    h0 = heads if heads is not None else base[0]
    quick = {(h0, d) for d in HEAD_DIMS} | {(h, base[1]) for h in head_counts}
    # A few spread pairs, for limits on the product (d_model) that one row and column miss.
    quick |= {(h, d) for h, d in ((8, 16), (7, 15), (5, 11), (3, 13), (6, 9))
              if heads is None}
    if all(builds(h, d) for h, d in sorted(quick)):
        return None
    allowed = {(h, d) for h, d in grid if builds(h, d)}
    if not allowed:
        raise ValueError("no generated configuration builds")
    return Constraint(tuple(sorted(allowed)), describe(allowed, grid))
