"""Record what a forward computes while it runs: every tensor's making (which tensors it came
from, whether the tokens flow into it), the products, the softmaxes and torch's SDPA calls.

:class:`CoreTracer` is a ``TorchFunctionMode``: it sees every torch function and tensor method
the forward calls, whatever module structure, names or layouts wrap them, and changes nothing
(each call runs as it would). :mod:`conformance.subject.attention_core` finds the attention
cores in what it recorded.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

PRODUCTS = frozenset({"matmul", "__matmul__", "__rmatmul__", "bmm", "einsum", "baddbmm"})
SOFTMAXES = frozenset({"softmax", "log_softmax", "special_softmax", "_softmax"})
SDPA = "scaled_dot_product_attention"

SCALINGS = frozenset({"mul", "mul_", "__mul__", "__rmul__", "__imul__", "multiply", "div", "div_",
                      "__truediv__", "__itruediv__", "true_divide", "divide"})
"""Ops that multiply a tensor by a scalar where their other operand is a number."""
PASSING = frozenset({
    "view", "reshape", "transpose", "permute", "contiguous", "unsqueeze", "squeeze", "expand",
    "expand_as", "flatten", "unflatten", "to", "float", "double", "half", "bfloat16", "type",
    "type_as", "clone", "repeat_interleave", "repeat", "swapaxes", "movedim", "__getitem__",
    "narrow", "split", "chunk", "unbind", "t", "detach", "cat", "concat", "concatenate", "stack",
    "neg", "__neg__", "negative", "add", "add_", "__add__", "__radd__", "__iadd__", "sub",
    "sub_", "__sub__", "__rsub__", "__isub__", "view_as", "reshape_as", "roll", "flip",
    "masked_fill", "masked_fill_", "where", "tensor_split", "index_select", "gather",
})
"""Ops through which a tensor is the same values, rearranged, or combined linearly with others
by constant coefficients: a scalar applied before them still multiplies what comes out."""

SHAPED_LIKE = frozenset({"to", "type_as", "view_as", "reshape_as", "expand_as"})
"""Ops whose second tensor gives only a dtype, a device or a shape: what comes out is made from
the first alone (Swin's ``mask.to(attn)`` is the mask, not the attention weights)."""

DIVISIONS = frozenset({"div", "__truediv__", "true_divide", "divide"})
SUBTRACTIONS = frozenset({"sub", "__sub__", "subtract"})
TOTAL_PASSING = frozenset({"clamp", "clamp_min", "add", "__add__", "maximum", "where",
                           "masked_fill", "to", "float", "type_as"})
"""What a hand-written softmax's denominator passes through after its sum (made safe from 0)."""
EXP_PASSING = frozenset({"masked_fill", "where", "mul", "__mul__", "to", "float", "type_as",
                         "nan_to_num"})
"""What its numerator passes through after the exp (a mask applied to it, a cast)."""

MAX_VISITS = 4000
"""Nodes one search of the record visits at most (a forward's record is a few hundred)."""

_SDPA_PARAMETERS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale",
                    "enable_gqa")


@dataclass(eq=False)
class Node:
    """One tensor as the forward made it: by which op (``name``) from which earlier tensors."""

    name: str
    parents: tuple[Node, ...]
    tainted: bool
    """The tokens flow into it (it depends on the forward's token inputs)."""
    shape: tuple[int, ...]
    learned: bool = False
    """A parameter, or made from one without the tokens."""
    scalar: float | None = None
    """For a scaling op by a number: the number it multiplies by (a division's inverse)."""
    children: list[Node] = field(default_factory=list)
    product: Product | None = None
    softmax: SoftmaxCall | None = None
    saved: torch.Tensor | None = None
    """An exp's input, a subtraction's first operand: what a hand-written softmax's logits
    are read from (see :meth:`CoreTracer._divided`)."""
    reduced: int | None = None
    """A sum's one axis."""


@dataclass
class Product:
    """A product of two tensors, as an einsum over letters: ``left``, ``right`` -> ``out``."""

    left: str
    right: str
    out: str
    operands: tuple[torch.Tensor, torch.Tensor]
    nodes: tuple[Node, Node]
    output: torch.Tensor

    @property
    def sizes(self) -> dict[str, int]:
        sizes: dict[str, int] = {}
        for letters, tensor in zip((self.left, self.right), self.operands, strict=True):
            for letter, size in zip(letters, tensor.shape, strict=True):
                sizes[letter] = max(sizes.get(letter, 1), size)
        return sizes

    @property
    def contracted(self) -> str:
        return "".join(letter for letter in self.left if letter in self.right
                       and letter not in self.out)

    def width(self) -> int:
        sizes = self.sizes
        width = 1
        for letter in self.contracted:
            width *= sizes[letter]
        return width

    def float64(self) -> torch.Tensor:
        """The product recomputed in float64 on the CPU (broadcast dimensions expanded)."""
        sizes = self.sizes
        left, right = (expand_to(t.detach().to(torch.float64).cpu(), letters, sizes)
                       for letters, t in zip((self.left, self.right), self.operands, strict=True))
        return torch.einsum(f"{self.left},{self.right}->{self.out}", left, right)


@dataclass
class SoftmaxCall:
    logits: torch.Tensor
    probabilities: torch.Tensor
    dim: int
    input_node: Node
    log: bool
    by_hand: bool = False
    """An exp divided by its sum, not torch's softmax."""


@dataclass
class SdpaCall:
    arguments: dict[str, object]
    output: torch.Tensor
    nodes: dict[str, Node]


def expand_to(tensor: torch.Tensor, letters: str, sizes: dict[str, int]) -> torch.Tensor:
    """``tensor`` (axes named by ``letters``) with its size-1 (broadcast) axes expanded."""
    return tensor.expand(*(sizes[letter] for letter in letters))


def _einsum_letters(equation: str, operands: tuple[torch.Tensor, torch.Tensor]
                    ) -> tuple[str, str, str] | None:
    """The two operands' and the output's letters of a two-operand einsum (an ellipsis named by
    letters of its own, right-aligned); None where the equation is not one we read."""
    equation = equation.replace(" ", "")
    if "->" not in equation:
        return None
    inputs, out = equation.split("->")
    parts = inputs.split(",")
    if len(parts) != 2:
        return None
    spare = [c for c in "ABCDEFGHIJKLMNOPQRSTUVWXYZ" if c not in equation]
    width = max((t.dim() - len(p.replace("...", "")) for p, t in zip(parts, operands, strict=True)
                 if "..." in p), default=0)
    ellipsis = "".join(spare[:width])
    named = []
    for part, tensor in zip(parts, operands, strict=True):
        if "..." in part:
            own = tensor.dim() - len(part.replace("...", ""))
            part = part.replace("...", ellipsis[width - own:] if own else "")
        if len(part) != tensor.dim() or not part.isalpha():
            return None
        named.append(part)
    out = out.replace("...", ellipsis)
    return named[0], named[1], out


def _matmul_letters(left: torch.Tensor, right: torch.Tensor) -> tuple[str, str, str] | None:
    if left.dim() < 2 or right.dim() < 2:
        return None
    batch = "abcdefgh"[: max(left.dim(), right.dim()) - 2]
    lb, rb = batch[len(batch) - (left.dim() - 2):], batch[len(batch) - (right.dim() - 2):]
    return f"{lb}mk", f"{rb}kn", f"{batch}mn"


class CoreTracer(TorchFunctionMode):
    """While entered, records the forward's ops (see the module docstring). ``taint`` the token
    inputs first."""

    def __init__(self) -> None:
        super().__init__()
        self._nodes: dict[int, Node] = {}
        self._kept: list[object] = []  # every recorded tensor stays alive: ids stay unique
        self.products: list[Product] = []
        self.softmaxes: list[Node] = []
        self.sdpa: list[SdpaCall] = []

    def taint(self, *tensors: torch.Tensor) -> None:
        for tensor in tensors:
            self._register(tensor, Node("input", (), True, tuple(tensor.shape)))

    def _register(self, tensor: torch.Tensor, node: Node) -> Node:
        self._nodes[id(tensor)] = node
        self._kept.append(tensor)
        return node

    def node(self, tensor: torch.Tensor) -> Node:
        """The node that made ``tensor`` (a leaf made from outside the forward: a parameter, a
        buffer, a constant)."""
        found = self._nodes.get(id(tensor))
        if found is None:
            found = self._register(tensor, Node("leaf", (), False, tuple(tensor.shape),
                                                learned=isinstance(tensor, nn.Parameter)))
        return found

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = getattr(func, "__name__", "")
        if name in ("__get__", "__set__", "dim", "size", "numel", "__len__", "item", "tolist",
                    "__bool__", "__format__", "__repr__", "is_floating_point"):
            return out
        # Recording must never change what the forward does: a record it can't make is left out.
        with contextlib.suppress(Exception):
            self._record(name, args, kwargs, out)
        return out

    def _record(self, name: str, args: tuple, kwargs: dict, out: object) -> None:
        flat, _ = tree_flatten((args, kwargs))
        tensors = [t for t in flat if isinstance(t, torch.Tensor)]
        if name in SHAPED_LIKE:
            tensors = tensors[:1]  # ``x.to(y)`` holds x's values only: y gives a dtype, a shape
        outputs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        if not outputs:
            return
        parents = tuple(self.node(t) for t in tensors)
        tainted = any(p.tainted for p in parents)
        learned = not tainted and any(p.learned for p in parents)
        scalar = _scalar(name, args) if name in SCALINGS else None
        made = []
        for tensor in outputs:
            node = Node(name, parents, tainted, tuple(tensor.shape), learned=learned,
                        scalar=scalar)
            for parent in parents:
                parent.children.append(node)
            made.append(self._register(tensor, node))
        node = made[0]
        if tainted and tensors and (name == "exp" or name in SUBTRACTIONS):
            node.saved = tensors[0].detach().clone()
        elif name == "sum" and tensors:
            node.reduced = _one_axis(args, kwargs, tensors[0])
        elif name in DIVISIONS and tainted and len(tensors) == 2 and len(outputs) == 1:
            self._divided(tensors, outputs[0], node)
        if name in PRODUCTS and len(outputs) == 1:
            self._product(name, args, outputs[0], node)
        elif name in SOFTMAXES and len(outputs) == 1:
            self._softmax(name, args, kwargs, outputs[0], node)
        elif name == SDPA and len(outputs) == 1:
            self._sdpa(args, kwargs, outputs[0])

    def _product(self, name: str, args: tuple, output: torch.Tensor, node: Node) -> None:
        if name == "einsum":
            operands = tuple(args[1]) if len(args) == 2 and isinstance(args[1], (list, tuple)) \
                else tuple(args[1:])
            if len(operands) != 2 or not isinstance(args[0], str):
                return
            letters = _einsum_letters(args[0], operands)
        else:
            operands = tuple(args[1:3]) if name == "baddbmm" else tuple(args[:2])
            if name == "__rmatmul__":
                operands = operands[::-1]
            if len(operands) != 2 or not all(isinstance(t, torch.Tensor) for t in operands):
                return
            letters = _matmul_letters(*operands)
        if letters is None:
            return
        product = Product(*letters, operands=tuple(t.detach().clone() for t in operands),
                          nodes=tuple(self.node(t) for t in operands),
                          output=output.detach().clone())
        node.product = product
        self.products.append(product)

    def _softmax(self, name: str, args: tuple, kwargs: dict, output: torch.Tensor,
                 node: Node) -> None:
        logits = args[0] if args else kwargs.get("input")
        dim = args[1] if len(args) > 1 else kwargs.get("dim")
        if not isinstance(logits, torch.Tensor) or not isinstance(dim, int):
            return
        probabilities = output.detach().clone()
        log = name == "log_softmax"
        if log:
            probabilities = probabilities.exp()
        node.softmax = SoftmaxCall(logits.detach().clone(), probabilities,
                                   dim % logits.dim(), self.node(logits), log)
        self.softmaxes.append(node)

    def _divided(self, tensors: list[torch.Tensor], output: torch.Tensor, node: Node) -> None:
        """A hand-written softmax: an exp (of logits, less their row's max or not; masked or
        not after it) divided by its own sum over one axis (made safe from 0 or not)."""
        numerator, denominator = (self.node(t) for t in tensors)
        total = _through(denominator, lambda n: n.name == "sum" and n.reduced is not None,
                         TOTAL_PASSING)
        if total is None or not total.parents or total.parents[0] is not numerator:
            return
        exp = _through(numerator, lambda n: n.name == "exp" and n.saved is not None,
                       EXP_PASSING)
        if exp is None or not exp.parents:
            return
        logits, logits_node = exp.saved, exp.parents[0]
        shifted = exp.parents[0]
        if (shifted.name in SUBTRACTIONS and shifted.saved is not None
                and len(shifted.parents) == 2 and not shifted.parents[1].product
                and shifted.saved.shape == logits.shape):
            logits, logits_node = shifted.saved, shifted.parents[0]  # the row's max taken off
        node.softmax = SoftmaxCall(logits, output.detach().clone(), total.reduced % logits.dim(),
                                   logits_node, False, by_hand=True)
        self.softmaxes.append(node)

    def _sdpa(self, args: tuple, kwargs: dict, output: torch.Tensor) -> None:
        arguments = dict(zip(_SDPA_PARAMETERS, args, strict=False))
        arguments.update(kwargs)
        if not all(isinstance(arguments.get(n), torch.Tensor) for n in ("query", "key", "value")):
            return
        nodes = {n: self.node(arguments[n]) for n in ("query", "key", "value")}
        kept = {n: (v.detach().clone() if isinstance(v, torch.Tensor) else v)
                for n, v in arguments.items()}
        self.sdpa.append(SdpaCall(kept, output.detach().clone(), nodes))


def _through(start: Node, found, passing: frozenset[str], depth: int = 4) -> Node | None:
    """The first node ``found`` holds of, from ``start`` up through its parents while they are
    ops in ``passing`` (at most ``depth`` ops up)."""
    frontier = [start]
    for _ in range(depth + 1):
        for node in frontier:
            if found(node):
                return node
        frontier = [parent for node in frontier if node.name in passing
                    for parent in node.parents if parent.tainted]
    return None


def _one_axis(args: tuple, kwargs: dict, tensor: torch.Tensor) -> int | None:
    """The one axis a reduction's arguments name, or None (all of them, or several)."""
    dim = args[1] if len(args) > 1 else kwargs.get("dim")
    if isinstance(dim, (tuple, list)) and len(dim) == 1:
        dim = dim[0]
    return dim % max(tensor.dim(), 1) if isinstance(dim, int) else None


def _scalar(name: str, args: tuple) -> float | None:
    """The number a scaling op multiplies its tensor operand by, or None where its other operand
    is not a number (a one-element tensor counts as one)."""
    if len(args) != 2:
        return None
    first, second = args
    divides = "div" in name
    if isinstance(first, torch.Tensor) and isinstance(second, torch.Tensor):
        if second.numel() == 1 and first.numel() > 1:
            second = float(second.detach().cpu().reshape(()))
        elif first.numel() == 1 and second.numel() > 1 and not divides:
            first, second = second, float(first.detach().cpu().reshape(()))
        else:
            return None
    number = second if isinstance(first, torch.Tensor) else first
    if isinstance(number, bool) or not isinstance(number, (int, float)):
        return None
    if divides:
        if not isinstance(first, torch.Tensor) or number == 0:
            return None  # a number divided by the tensor is no scaling
        return 1.0 / number
    return float(number)

