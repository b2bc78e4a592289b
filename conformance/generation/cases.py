"""A generated test case: a few integers that fully determine a configuration and its tensors.

Hypothesis draws and shrinks these integers, never raw float arrays, so a counterexample is a line
a user can paste: ``Case(batch=2, q_len=2, kv_len=2, num_heads=2, head_dim=1, seed=0, ...)``.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, fields, replace

import torch

from conformance.model.spec import CallConvention, Capabilities, Config
from conformance.numerics.reference import allowed_keys
from conformance.subject.boundary import Inputs

MAX_LEN = 33
"""The longest sequence generated (queries or keys); inference's trials stay within it too."""

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float64": torch.float64,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


@dataclass(frozen=True)
class Case:
    """One generated case.

    ``kept[b]`` is how many keys batch element ``b`` keeps (0 = every key masked); ``None`` means
    no mask. With ``mask_seed`` None the kept keys are the first ones (right padding); otherwise
    ``mask_seed`` scatters them. ``shared_mask``: every batch element gets the same mask (for a
    shared (Lq, Lk) mask format). ``seed`` fixes the inputs and the parameter initialisation.
    """

    batch: int
    q_len: int
    kv_len: int
    num_heads: int
    head_dim: int
    dtype: str = "float32"
    device: str = "cpu"
    seed: int = 0
    kept: tuple[int, ...] | None = None
    mask_seed: int | None = None
    causal: bool = False
    dropout: float = 0.0
    shared_mask: bool = False
    kv_heads: int | None = None
    window: int | None = None
    chunk: int | None = None

    def __repr__(self) -> str:
        defaults = {f.name: f.default for f in fields(self)}
        always = ("batch", "q_len", "kv_len", "num_heads", "head_dim", "dtype", "seed")
        shown = [f"{name}={getattr(self, name)!r}" for name in defaults
                 if name in always or getattr(self, name) != defaults[name]]
        return f"Case({', '.join(shown)})"

    @classmethod
    def parse(cls, text: str) -> Case:
        """The case a ``Case(...)`` string (a report's falsifying example) names; ValueError with
        one line when it is not one. Only literal field values are read: nothing is evaluated."""
        try:
            call = ast.parse(text.strip(), mode="eval").body
        except SyntaxError:
            call = None
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name)
                and call.func.id == "Case" and not call.args):
            raise ValueError(f"{text!r} is not a Case(...) as a report prints it, e.g. "
                             "Case(batch=1, q_len=2, kv_len=2, num_heads=2, head_dim=1, "
                             "dtype='float32', seed=0)")
        known = {f.name for f in fields(cls)}
        values = {}
        for keyword in call.keywords:
            if keyword.arg not in known:
                raise ValueError(f"Case has no field {keyword.arg!r} (fields: "
                                 f"{', '.join(sorted(known))})")
            try:
                values[keyword.arg] = ast.literal_eval(keyword.value)
            except ValueError:
                raise ValueError(f"Case field {keyword.arg}: give a literal value") from None
        if isinstance(values.get("kept"), list):
            values["kept"] = tuple(values["kept"])
        try:
            return cls(**values)
        except TypeError as error:
            raise ValueError(f"{text!r}: {error}") from None

    def at_length(self, length: int) -> Case:
        """This case with ``length`` queries and keys, keeping no more keys than there are (a
        module that takes one length gets it, whatever length was asked for)."""
        kept = None if self.kept is None else tuple(min(k, length) for k in self.kept)
        return replace(self, q_len=length, kv_len=length, kept=kept)

    @property
    def config(self) -> Config:
        return Config(batch=self.batch, q_len=self.q_len, kv_len=self.kv_len,
                      d_model=self.num_heads * self.head_dim, num_heads=self.num_heads,
                      dropout=self.dropout, dtype=DTYPES[self.dtype], device=self.device,
                      num_kv_heads=self.kv_heads, window=self.window, chunk=self.chunk)

    @property
    def d_model(self) -> int:
        return self.num_heads * self.head_dim

    def keep(self) -> torch.Tensor | None:
        """(B, Lk) bool on the case's device, or None."""
        if self.kept is None:
            return None
        keep = torch.zeros(self.batch, self.kv_len, dtype=torch.bool)
        generator = None
        if self.mask_seed is not None:
            generator = torch.Generator().manual_seed(self.mask_seed)
        for b, count in enumerate(self.kept):
            if generator is None:
                keep[b, :count] = True
            elif self.shared_mask and b:
                keep[b] = keep[0]
            else:
                keep[b, torch.randperm(self.kv_len, generator=generator)[:count]] = True
        return keep.to(self.device)

    def attendable_rows(self) -> torch.Tensor:
        """(B, Lq) bool on the CPU: rows with at least one key to attend to (mask and causality)."""
        keep = self.keep()
        allowed = allowed_keys(self.batch, self.q_len, self.kv_len,
                               None if keep is None else keep.cpu(), self.causal,
                               window=self.window, chunk=self.chunk)
        return allowed.any(dim=-1)[:, 0]

    def tensor(self, *shape: int, stream: int = 0, scale: float = 1.0) -> torch.Tensor:
        """A standard-normal tensor from (seed, stream), in the case's dtype and device."""
        generator = torch.Generator().manual_seed(self.seed * 1009 + stream)
        values = torch.randn(*shape, generator=generator, dtype=torch.float64) * scale
        return values.to(DTYPES[self.dtype]).to(self.device)

    def replace_positions(self, inputs: Inputs, where: torch.Tensor, *, stream: int,
                          scale: float, query_too: bool = False) -> Inputs:
        """``inputs`` with the key/value inputs (self-attention: x) replaced by fresh noise at
        positions ``where`` (B, L) bool: key from ``stream``, value from ``stream + 1``, and
        with ``query_too`` the query from ``stream + 2``."""
        position = where.to(inputs.query.device)[:, :, None]

        def noisy(tensor: torch.Tensor, offset: int) -> torch.Tensor:
            noise = self.tensor(*tensor.shape, stream=stream + offset, scale=scale)
            return torch.where(position, noise, tensor)

        if inputs.is_self:
            return inputs.with_tensors(noisy(inputs.query, 0))
        query = noisy(inputs.query, 2) if query_too else inputs.query
        if inputs.shares_kv:
            return inputs.with_tensors(query, noisy(inputs.key, 0))
        return inputs.with_tensors(query, noisy(inputs.key, 0), noisy(inputs.value, 1))

    def inputs(self, call: CallConvention, *, keep: torch.Tensor | None = None,
               use_mask: bool = True) -> Inputs:
        """The case's inputs in the given call convention, with its mask unless told otherwise."""
        mask = keep if keep is not None else (self.keep() if use_mask else None)
        if call == "self":
            return Inputs.self_attention(self.tensor(self.batch, self.q_len, self.d_model),
                                         mask, self.causal)
        if call in ("cross", "latent"):
            # latent: the queries are the module's own; ``query`` only stands for their rows
            # (never passed to it), so every output row is compared as a cross-attention's.
            context = self.tensor(self.batch, self.kv_len, self.d_model, stream=1)
            return Inputs(query=self.tensor(self.batch, self.q_len, self.d_model, stream=0),
                          key=context, value=context, keep=mask, causal=self.causal)
        return Inputs(
            query=self.tensor(self.batch, self.q_len, self.d_model, stream=0),
            key=self.tensor(self.batch, self.kv_len, self.d_model, stream=1),
            value=self.tensor(self.batch, self.kv_len, self.d_model, stream=2),
            keep=mask, causal=self.causal)


def own_queries(case: Case, caps: Capabilities) -> Case:
    """``case`` with as many queries as the module holds, where its queries are its own (the
    ``latent`` call: its output has that many rows whatever the input): never causal."""
    return case if caps.queries is None else replace(case, q_len=caps.queries, causal=False)
