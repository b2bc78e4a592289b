"""Find the attention cores in what a forward computed (:mod:`conformance.subject.core_trace`).

A softmax is an attention core where its logits come from products of token-derived tensors
(q·kᵀ: one product, or several summed, as MLA's rotary and non-rotary parts) and its
probabilities, after whatever the forward does to them, weight token-derived values over an
axis as long as the keys. Which axis holds the keys is read from that product with the values,
not from the softmax's ``dim`` (so a softmax over the queries is seen as one); the query axis is
the other operand's axis as long as the queries. A softmax over anything else (a router's, a
pooling's) is no core. Each of torch's ``scaled_dot_product_attention`` calls is one.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

from conformance.model.core import AttentionSite, CoreKind
from conformance.subject.core_trace import (
    MAX_VISITS,
    SCALINGS,
    CoreTracer,
    Node,
    Product,
    SdpaCall,
)
from conformance.subject.core_widths import absorbed_width, broadcast_width, factor, parts, widths


def sites(tracer: CoreTracer, q_len: int, kv_len: int) -> tuple[AttentionSite, ...]:
    """The attention cores among what ``tracer`` recorded of a forward over ``q_len`` queries
    and ``kv_len`` keys, in the order they were computed: those whose logits the tokens reach
    (a model driving a layer runs its other layers' cores on inputs of its own first)."""
    found: list[AttentionSite] = []
    for node in tracer.softmaxes:
        site = _softmax_site(tracer, node, q_len, kv_len) if node.softmax.input_node.tainted \
            else None
        if site is not None:
            found.append(site)
    for call in tracer.sdpa:
        reached = call.nodes["query"].tainted or call.nodes["key"].tainted
        site = _sdpa_site(call, q_len, kv_len) if reached else None
        if site is not None:
            found.append(site)
    return tuple(found)


def _walk(start: Node, onward: str) -> Iterable[Node]:
    """Nodes reached from ``start`` (not included) through parents or children, breadth first,
    never past a product or a softmax (they are yielded, not crossed)."""
    seen = {id(start)}
    frontier = [start]
    while frontier and len(seen) < MAX_VISITS:
        node = frontier.pop(0)
        for other in getattr(node, onward):
            if id(other) in seen:
                continue
            seen.add(id(other))
            yield other
            if other.product is None and other.softmax is None and other.name != "input":
                frontier.append(other)


def _fits(product: Product, shape: tuple[int, ...]) -> bool:
    """Whether ``product``'s output is the logits of ``shape``: the same, or shorter along one
    axis (columns joined on: attention sinks), or the same values in another shape."""
    out = tuple(product.output.shape)
    if len(out) != len(shape):
        return product.output.numel() == math.prod(shape)
    return sum(a != b for a, b in zip(out, shape, strict=True)) <= 1 and all(
        a <= b for a, b in zip(out, shape, strict=True))


def _placed(term: Product, shape: tuple[int, ...]) -> torch.Tensor:
    """``term`` recomputed in float64 in the logits' ``shape``: NaN in columns joined on after
    it (sinks), which no q·kᵀ made."""
    values = term.float64()
    if values.dim() != len(shape):
        return values.reshape(shape)
    placed = torch.full(shape, float("nan"), dtype=torch.float64)
    placed[tuple(slice(0, size) for size in values.shape)] = values
    return placed


def _score_products(tracer: CoreTracer, start: Node, shape: tuple[int, ...]
                    ) -> tuple[list[Product], bool]:
    """The products q·kᵀ the logits ``start`` are made from (both operands token-derived where
    any is: a position term multiplying q by a table is bias, not a score), in the order they
    were computed; and whether a learned parameter multiplies the logits after them."""
    reached = [start] if start.product is not None else []
    learned = False
    for node in ([start] if start.product is None else []) + list(_walk(start, "parents")):
        if not node.tainted:
            continue
        if node.product is not None:
            reached.append(node)
        elif node.name in SCALINGS and any(p.learned and not p.tainted for p in node.parents):
            learned = True
    products = [n.product for n in reached if n.product is not None
                and _fits(n.product, shape) and n.tainted]
    both = [p for p in products if all(n.tainted for n in p.nodes)]
    chosen = both or products
    order = {id(p): i for i, p in enumerate(tracer.products)}
    return sorted(chosen, key=lambda p: order[id(p)]), learned


def _softcap(start: Node) -> float | None:
    """Where the logits ``start`` are c·tanh(·) of the scores (a logit softcap, Gemma 2's), c:
    the scalar the tanh's output is multiplied by on its way to the softmax; None without one."""
    stack: list[tuple[Node, float]] = [(start, 1.0)]
    seen: set[int] = set()
    while stack and len(seen) < MAX_VISITS:
        node, factor = stack.pop()
        if id(node) in seen or not node.tainted or node.product is not None:
            continue
        seen.add(id(node))
        if node.name == "tanh":
            return factor if factor != 1.0 else None
        if node.name in SCALINGS and node.scalar is not None:
            factor *= abs(node.scalar)
        stack.extend((parent, factor) for parent in node.parents)
    return None


def _value_product(tracer: CoreTracer, start: Node) -> tuple[Product, int] | None:
    """The first product that multiplies (something made from) the probabilities ``start`` with
    token-derived values, and which of its operands the probabilities are."""
    order = {id(p): i for i, p in enumerate(tracer.products)}
    reached = list(_walk(start, "children"))
    # Made from the probabilities without a product in between (walked once, not per product).
    descends = {id(start)} | {id(node) for node in reached}
    candidates = []
    for node in reached:
        product = node.product
        if product is None:
            continue
        sides = [i for i, operand in enumerate(product.nodes) if id(operand) in descends]
        if len(sides) == 1 and product.nodes[1 - sides[0]].tainted:
            candidates.append((order[id(product)], product, sides[0]))
    if not candidates:
        return None
    _, product, side = min(candidates, key=lambda c: c[0])
    return product, side


def _maps_combined(start: Node) -> int:
    """How many softmax maps the weights ``start`` combine: the most token-derived operands
    made from a softmax that one op between them and the softmaxes joins (two for a difference
    of maps, or of two slices of one softmax's output; one where a mask or a cast is all)."""
    most = 1
    for node in [start, *_walk(start, "parents")]:
        if node.product is None and node.softmax is None:
            maps = sum(1 for parent in node.parents if parent.tainted and (
                parent.softmax is not None or any(
                    n.softmax is not None for n in _walk(parent, "parents"))))
            most = max(most, maps)
    return most


def _arrange(tensor: torch.Tensor, letters: str, target: str, sizes: dict[str, int]
             ) -> torch.Tensor:
    """``tensor`` (axes ``letters``) with its axes in the order ``target``: missing letters
    broadcast, size-1 axes expanded."""
    present = [letter for letter in target if letter in letters]
    moved = tensor.permute(*(letters.index(letter) for letter in present))
    shape = [tensor.shape[letters.index(letter)] if letter in letters else 1 for letter in target]
    return moved.reshape(shape).expand(*(sizes[letter] for letter in target))


def _softmax_site(tracer: CoreTracer, node: Node, q_len: int, kv_len: int
                  ) -> AttentionSite | None:
    call = node.softmax
    logits, probabilities = call.logits, call.probabilities
    shape = tuple(logits.shape)
    terms, learned = _score_products(tracer, call.input_node, shape)
    if not terms:
        return None
    found = _value_product(tracer, node)
    key_axis, sinks, used, over_keys = call.dim, 0, None, None
    if found is not None:
        product, side = found
        letters = (product.left, product.right)[side]
        other = (product.right, product.left)[side]
        contracted = [c for c in letters if c in other and c not in product.out]
        if len(contracted) != 1:
            found = None
        else:
            index = letters.index(contracted[0])
            used = product.operands[side]
            if product.sizes[contracted[0]] != kv_len:
                return None  # weights over something else than the keys (a router's)
            if used.dim() == len(shape) and all(
                    a == b for i, (a, b) in enumerate(zip(used.shape, shape, strict=True))
                    if i != index):
                key_axis, sinks = index, shape[index] - used.shape[index]
            elif index == used.dim() - 1:
                key_axis, sinks = len(shape) - 1, shape[-1] - used.shape[-1]
            else:
                found, used = None, None
            over_keys = call.dim == key_axis if found is not None else None
    if sinks < 0 or shape[key_axis] - sinks != kv_len:
        return None
    query_axis = _query_axis(terms[0], shape, key_axis, q_len)
    if query_axis is None:
        return None
    temperature = _queries_scaled_by_position(terms[0], shape, query_axis)
    mixed = any(_learned_operand(term) for term in terms)
    normalised = _qk_norm(terms[0])
    others = [a for a in range(len(shape)) if a not in (query_axis, key_axis)]
    order = [*others, query_axis, key_axis]

    def canonical(t: torch.Tensor) -> torch.Tensor:
        return t.permute(*order).reshape(-1, q_len, t.shape[key_axis])

    scores = torch.zeros(shape, dtype=torch.float64)
    scalars_known = True
    for term in terms:
        f_left, f_right = factor(term.nodes[0]), factor(term.nodes[1])
        if f_left is None or f_right is None or f_left * f_right == 0:
            scalars_known = False
            f_left = f_right = 1.0
        scores += _placed(term, shape) / (f_left * f_right)
    values = result = weights = None
    if found is not None:
        product, side = found
        weights, values, result = _weights_and_values(product, side, order, shape, q_len)
    kind = ("an exp over its sum (a hand-written softmax)" if call.by_hand
            else "log_softmax" if call.log else "softmax")
    how = (f"{kind} over axis {call.dim} of logits "
           f"{tuple(shape)} from {len(terms)} product(s) q·kᵀ"
           + ("" if found is None else ", applied to values by a product"))
    return AttentionSite(
        kind=CoreKind.SOFTMAX, scores=canonical(scores),
        widths=widths(terms), term_widths=parts(terms),
        logits=canonical(logits), probabilities=canonical(probabilities),
        used=weights, values=values, result=result, over_keys=over_keys,
        combined=_maps_combined(found[0].nodes[found[1]]) if found is not None else 1,
        sinks=sinks, learned_scale=learned, scalars_known=scalars_known,
        query_temperature=temperature, qk_norm=normalised, heads_mixed=mixed,
        softcap=_softcap(call.input_node), how=how)


def _queries_scaled_by_position(term: Product, shape: tuple[int, ...], query_axis: int) -> bool:
    """Whether the queries of ``term`` (the operand holding the logits' query axis) were
    multiplied, since their projection, by a tensor the tokens and the parameters don't make
    that varies along positions and is one number per position (a (L, 1) table, broadcast over
    the features): a temperature of the query's position, Llama 4's. RoPE's tables vary over the
    features, a scale is one number, a learned one is a parameter: none of them is this."""
    if len(term.output.shape) != len(shape):
        return False
    letter = term.out[query_axis]
    sides = [i for i, letters in enumerate((term.left, term.right)) if letter in letters]
    if len(sides) != 1:
        return False
    start = term.nodes[sides[0]]
    for node in [start, *_walk(start, "parents")]:
        if node.name not in SCALINGS or node.scalar is not None or not node.tainted:
            continue
        for parent in node.parents:
            if (not parent.tainted and not parent.learned and len(parent.shape) >= 2
                    and parent.shape[-1] == 1 and math.prod(parent.shape) > 1):
                return True
    return False


NORMS = frozenset({"rsqrt", "norm", "layer_norm", "rms_norm", "group_norm", "linalg_vector_norm",
                   "normalize"})
"""Ops that normalise a tensor by its own statistics (a QK-norm's RMSNorm or LayerNorm)."""


def _learned_operand(term: Product) -> bool:
    """Whether ``term`` multiplies token-derived logits by a parameter (a learned matrix that
    mixes the heads' logits, talking heads'): then it is no q·kᵀ, and the product that is lies
    before it."""
    return any(node.learned and not node.tainted for node in term.nodes)


def _normalised_width(start: Node) -> int | None:
    """The width of the features the operand ``start`` of q·kᵀ was normalised over by their own
    statistics since its projection (a QK-norm), or None where it was not: a norm's own output
    width, or for an ``rsqrt`` of a mean (a hand-written RMSNorm) the width of what it
    multiplies."""
    for node in [start, *_walk(start, "parents")]:
        if node.name not in NORMS or not node.tainted or not node.shape:
            continue
        if node.shape[-1] > 1:
            return node.shape[-1]
        multiplied = [child.shape[-1] for child in node.children if child.shape]
        return max(multiplied) if multiplied else None
    return None


def _qk_norm(term: Product) -> str | None:
    """``"head"`` where q or k was normalised per head after its projection (Qwen 3's QK-norm:
    over the width where q and k meet), ``"heads"`` where over more (every head together before
    the split, OLMo 2's), None without a QK-norm."""
    return _qk_norm_of(term.nodes, term.width())


def _qk_norm_of(operands, width: int) -> str | None:
    """The QK-norm (see :func:`_qk_norm`) of q and k, the ``operands`` that meet ``width``
    wide (a product's, or SDPA's query and key)."""
    widths = [w for w in (_normalised_width(node) for node in operands) if w is not None]
    if not widths:
        return None
    return "head" if all(w <= width for w in widths) else "heads"


def _query_axis(term: Product, shape: tuple[int, ...], key_axis: int, q_len: int) -> int | None:
    """The logits' query axis: as long as the queries, from the operand that does not hold the
    keys (where the product's output is the logits' shape); None where that is ambiguous."""
    candidates = [a for a in range(len(shape)) if a != key_axis and shape[a] == q_len]
    if len(term.output.shape) == len(shape):
        key = term.out[key_axis]
        query_side = term.right if key in term.left else term.left
        key_side = term.left if key in term.left else term.right
        narrowed = [a for a in candidates
                    if term.out[a] in query_side and term.out[a] not in key_side]
        candidates = narrowed or candidates
    return candidates[0] if len(candidates) == 1 else None


def _weights_and_values(product: Product, side: int, order: list[int], shape: tuple[int, ...],
                        q_len: int) -> tuple[torch.Tensor | None, ...]:
    """The weights that multiply the values, the values and the product's result, in the
    canonical layout; the last two None where their axes can't be matched with the logits'."""
    used = product.operands[side]
    letters = (product.left, product.right)[side]
    other_letters = (product.right, product.left)[side]
    value_tensor = product.operands[1 - side]
    if used.dim() != len(shape):
        if order[-2:] != [len(shape) - 2, len(shape) - 1] or used.shape[-2] != q_len:
            return None, None, None
        return used.reshape(-1, q_len, used.shape[-1]), None, None
    weights = used.permute(*order).reshape(-1, q_len, used.shape[order[-1]])
    key, query = letters[order[-1]], letters[order[-2]]
    batch = "".join(letters[a] for a in order[:-2])
    free = "".join(c for c in other_letters if c not in letters)
    if len(free) != 1 or sorted(product.out) != sorted(batch + query + free):
        return weights, None, None
    sizes = product.sizes
    values = _arrange(value_tensor, other_letters, batch + key + free, sizes)
    result = _arrange(product.output, product.out, batch + query + free, sizes)
    return (weights, values.reshape(-1, sizes[key], sizes[free]),
            result.reshape(-1, q_len, sizes[free]))


def _sdpa_site(call: SdpaCall, q_len: int, kv_len: int) -> AttentionSite | None:
    args = call.arguments
    q, k, v = args["query"], args["key"], args["value"]
    if q.dim() < 2 or q.shape[-2] != q_len or k.shape[-2] != kv_len:
        return None
    if args.get("enable_gqa") and q.dim() >= 3 and k.shape[-3] != q.shape[-3]:
        group = q.shape[-3] // k.shape[-3]
        k, v = k.repeat_interleave(group, dim=-3), v.repeat_interleave(group, dim=-3)
    lead = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    width = q.shape[-1]

    def flat(t: torch.Tensor) -> torch.Tensor:
        return t.expand(*lead, *t.shape[-2:]).reshape(-1, *t.shape[-2:]).to(torch.float64).cpu()

    f_q, f_k = factor(call.nodes["query"]), factor(call.nodes["key"])
    scalars_known = f_q is not None and f_k is not None and f_q * f_k != 0
    product = 1.0 if not scalars_known else f_q * f_k
    scores = flat(q) @ flat(k).transpose(-1, -2) / product
    given = args.get("scale")
    scale = (1 / math.sqrt(width) if given is None else float(given)) * product
    allowed = torch.ones(scores.shape, dtype=torch.bool)
    bias = torch.zeros(scores.shape, dtype=torch.float64)
    mask = args.get("attn_mask")
    if isinstance(mask, torch.Tensor):
        full = mask.expand(*lead, q_len, kv_len).reshape(-1, q_len, kv_len).cpu()
        if full.dtype == torch.bool:
            allowed &= full
        else:
            allowed &= full > float("-inf")
            bias = torch.where(allowed, full.to(torch.float64), 0.0)
    if args.get("is_causal"):
        allowed &= torch.ones(q_len, kv_len, dtype=torch.bool).tril()
    readings = [reading(call.nodes[name]) for name in ("query", "key")
                for reading in (absorbed_width, lambda node: broadcast_width(node, width))]
    widths = (width, *sorted({w for w in readings if w is not None and w != width}))
    return AttentionSite(
        kind=CoreKind.SDPA, scores=scores, widths=widths, values=flat(v),
        result=call.output.expand(*lead, q_len, call.output.shape[-1]).reshape(
            -1, q_len, call.output.shape[-1]), scale=scale, allowed=allowed, bias=bias,
        over_keys=True, scalars_known=scalars_known,
        qk_norm=_qk_norm_of((call.nodes["query"], call.nodes["key"]), width),
        how=f"scaled_dot_product_attention over q {tuple(q.shape)}, k {tuple(k.shape)}")

