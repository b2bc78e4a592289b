"""The widths and scalars of q and k where an attention core's logits are made: the width q·kᵀ
contracts (and the other readings the core admits), the parts it is joined from, and the scalar
q or k was multiplied by since it was made (a scale applied to q before the product)."""

from __future__ import annotations

from conformance.subject.core_trace import PASSING, SCALINGS, Node, Product

ELEMENTWISE = SCALINGS | {"add", "add_", "__add__", "__radd__", "__iadd__", "sub", "sub_",
                          "__sub__", "__rsub__", "__isub__"}
"""Ops that combine tensors element by element, broadcasting a size-1 axis."""

SAME_FACTOR = 1e-6
"""Relative difference under which two paths' scalar factors are one factor (float rounding)."""


def _factor(node: Node, memo: dict[int, set[float]]) -> set[float]:
    """The magnitudes of the scalars a token-derived tensor was multiplied by since it was made,
    one per path back to where it was made (a product, a projection, a norm, the input)."""
    if id(node) in memo:
        return memo[id(node)]
    memo[id(node)] = {1.0}  # a cycle (never in a record) reads as no factor
    tainted = [p for p in node.parents if p.tainted]
    if node.product is not None or node.softmax is not None or not tainted:
        found = {1.0}
    elif node.name in SCALINGS and node.scalar is not None:
        found = {abs(node.scalar) * f for f in _factor(tainted[0], memo)}
    elif node.name in SCALINGS:
        found = _factor(tainted[0], memo) if len(tainted) == 1 else {1.0}
    elif node.name in PASSING:
        found = set().union(*(_factor(p, memo) for p in tainted))
    else:
        found = {1.0}
    memo[id(node)] = found
    return found


def factor(node: Node) -> float | None:
    """The one scalar (magnitude) ``node``'s tensor was multiplied by since it was made, or None
    where paths disagree."""
    values = sorted(_factor(node, {}))
    if not values or values[-1] - values[0] > SAME_FACTOR * values[-1]:
        return None
    return values[0]


def absorbed_width(node: Node) -> int | None:
    """Where ``node`` is (up to casts and scalars) a product of a token-derived tensor with a
    weight, the width that product contracts: q multiplied by a weight before the scores (an
    absorbed projection) had that width before."""
    while node.product is None:
        tainted = [p for p in node.parents if p.tainted]
        if node.name not in {"to", "float", "double", "half", "bfloat16", "type_as", "contiguous",
                             "clone", *SCALINGS} or len(tainted) != 1:
            return None
        node = tainted[0]
    if sum(n.tainted for n in node.product.nodes) != 1:
        return None
    return node.product.width()


def broadcast_width(node: Node, width: int) -> int | None:
    """1 where q (or k) of ``width`` > 1 was made from a token-derived tensor one wide, broadcast
    over its last axis on the way (HuggingFace's RoPE at head width 1: a one-dimensional q times
    two-column cos/sin tables): its projection's width, where 1/sqrt(w) is read; else None."""
    if width <= 1:
        return None
    frontier, seen = [node], {id(node)}
    while frontier and len(seen) < 64:
        node = frontier.pop(0)
        if node.product is not None or node.softmax is not None or \
                node.name not in PASSING | SCALINGS:
            continue  # as far as rearranging and elementwise ops go: not past a projection
        tainted = [p for p in node.parents if p.tainted]
        if node.name in ELEMENTWISE and node.shape and node.shape[-1] == width and any(
                p.shape and p.shape[-1] == 1 for p in tainted):
            return 1  # an elementwise op broadcast the one column (not a join: cat adds widths)
        for parent in tainted:
            if id(parent) not in seen:
                seen.add(id(parent))
                frontier.append(parent)
    return None


def _joined(node: Node, width: int) -> tuple[int, ...]:
    """Where q (or k) of ``width`` was joined along its last axis from parts (MLA's non-rotary
    and rotary dimensions, ``cat([q_nope, q_pe], -1)``), their widths; else ()."""
    for _ in range(16):
        if node.name in ("cat", "concat", "concatenate") and len(node.parents) > 1 and (
                node.shape and node.shape[-1] == width
                and sum(p.shape[-1] if p.shape else 0 for p in node.parents) == width):
            return tuple(p.shape[-1] for p in node.parents)
        tainted = [p for p in node.parents if p.tainted]
        if len(tainted) != 1 or node.product is not None or node.name not in PASSING | SCALINGS:
            return ()
        node = tainted[0]
    return ()


def parts(terms: list[Product]) -> tuple[int, ...]:
    """The widths of the parts the logits' q·kᵀ is made of: each product's, or, for one
    product, the parts its q was joined from."""
    if len(terms) > 1:
        return tuple(t.width() for t in terms)
    width = terms[0].width()
    return next((found for found in (_joined(n, width) for n in terms[0].nodes) if found), ())


def widths(terms: list[Product]) -> tuple[int, ...]:
    """The q/k width the terms contract (summed), then each other reading (see AttentionSite)."""
    totals = {0}
    for term in terms:
        options = {term.width()}
        for node in term.nodes:
            for reading in (absorbed_width(node), broadcast_width(node, term.width())):
                if reading is not None:
                    options.add(reading)
        totals = {t + o for t in totals for o in options}
    base = sum(term.width() for term in terms)
    return (base, *sorted(totals - {base}))
