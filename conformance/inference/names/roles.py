"""Constructor parameters by role, read from their names."""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field

WIDTH = ("d_model", "hidden_dim", "embed_dim", "d_in", "input_dim", "dim", "n_embd",
         "hidden_size", "emb_dim", "model_dim", "n_state", "query_dim", "embed_size", "d_embed",
         "emb_size", "n_embed", "dim_model", "embedding_dim", "width")
HEADS = ("num_heads", "nums_head", "heads", "n_heads", "n_head", "h", "num_attention_heads",
         "nhead", "head_count", "num_head", "nheads", "attention_heads", "n_attention_heads",
         "encoder_attention_heads", "decoder_attention_heads")
HEAD_DIM = ("head_size", "head_dim", "d_head", "dim_head", "d_k", "head_width",
            "attention_head_size", "dim_per_head", "kv_channels")
OUTPUT = ("d_out", "output_dim", "out_dim")
DROPOUT = ("dropout", "p", "attn_dropout", "dropout_prob", "attn_pdrop", "attention_dropout",
           "dropout_rate")
CONTEXT = ("block_size", "context_length", "max_seq_len", "max_position_embeddings",
           "max_len", "seq_len")
CAUSAL = ("causal", "is_causal")
BATCH_FIRST = ("batch_first",)
KV_HEADS = ("n_kv_heads", "num_kv_heads", "num_key_value_heads", "kv_heads", "n_kv_head",
            "num_kv_head", "n_head_kv", "num_query_groups", "kv_head_count", "n_kv")
"""Key/value heads of grouped-query attention (Megatron's ``num_query_groups`` counts them
too; HuggingFace's ``num_key_value_groups`` is the ratio, not the count, and is not here)."""
WINDOW = ("sliding_window", "window_size", "window", "attention_window", "local_window",
          "window_length", "sliding_window_size", "local_window_size", "max_attend_past",
          "attend_past")
CHUNK = ("attention_chunk_size", "chunk_size", "attn_chunk_size", "chunk_len", "chunk_length",
         "local_chunk_size")
"""Causal chunked attention (Llama 4's ``attention_chunk_size``). A name only orders the search:
``chunk_size`` also names computation tiles that change nothing a row sees, which the probe of
:mod:`conformance.inference.steps.features` tells apart."""
MAX_BATCH = ("max_batch_size", "max_batch")

MAX_BATCH_SIZE = 8
"""What a maximum-batch parameter (a preallocated cache's) is set to: above the largest generated
batch."""

CONTEXT_LENGTH = 512
"""The longest sequence a module with a context-length parameter is given (the long-sequence
case of ``low_precision``): what the parameter is set to for such a case."""

SHORT_CONTEXT = 128
"""What a context-length parameter is set to for a case of at most :data:`SHORT_CASE` tokens
(every case but that long one): a nanoGPT ``tril(ones(block_size, block_size))`` buffer, built
for every example, costs 1.7 ms at 512 and 0.45 ms at 128 (four heads; a check builds hundreds).
Still above every position such a case's calls reach (its tokens, shifted by at most 9 in
``position_shift``; a KV cache decodes within them), and above the case's own length, so a
forward that forgets to slice its buffer to the sequence still fails as it did."""

SHORT_CASE = 64
"""The longest case built with :data:`SHORT_CONTEXT` (at most half of it: the margin is for
shifted positions)."""


def context_length(q_len: int, kv_len: int) -> int:
    """What a context-length parameter is set to for a case of these lengths."""
    return SHORT_CONTEXT if max(q_len, kv_len) <= SHORT_CASE else CONTEXT_LENGTH


@dataclass
class ConstructorRoles:
    """Which constructor parameter plays which role; ``unknown`` lists required ones that none do."""

    width: str | None = None
    heads: str | None = None
    head_dim: str | None = None
    output: str | None = None
    dropout: str | None = None
    context: str | None = None
    causal: str | None = None
    batch_first: str | None = None
    kv_heads: str | None = None
    kv_group: str | None = None
    """Query heads per key/value head (a group size), where an argument sets that instead of
    the count (found by trial: see :mod:`conformance.inference.construction.trial`)."""
    window: str | None = None
    chunk: str | None = None
    max_batch: str | None = None
    unknown: list[str] = field(default_factory=list)

    def describe(self) -> str:
        parts = [f"{role} = {name}" for role, name in (
            ("width", self.width), ("heads", self.heads), ("head width", self.head_dim),
            ("output width", self.output), ("dropout", self.dropout),
            ("context", self.context), ("key/value heads", self.kv_heads),
            ("query heads per key/value head", self.kv_group),
            ("sliding window", self.window), ("causal chunk", self.chunk),
            ("max batch", self.max_batch)) if name]
        return "constructor " + (", ".join(parts) if parts else "takes no known role")


ROLE_NAMES = (("width", WIDTH), ("heads", HEADS), ("head_dim", HEAD_DIM), ("output", OUTPUT),
              ("dropout", DROPOUT), ("context", CONTEXT), ("causal", CAUSAL),
              ("batch_first", BATCH_FIRST), ("kv_heads", KV_HEADS), ("window", WINDOW),
              ("chunk", CHUNK), ("max_batch", MAX_BATCH))
"""Each role and the names that suggest it, in the order roles are matched."""


def read_roles(cls: type) -> ConstructorRoles:
    """The roles of ``cls.__init__``'s parameters."""
    parameters = list(inspect.signature(cls.__init__).parameters.values())[1:]
    return roles_named([(p.name, p.default is p.empty) for p in parameters
                        if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)])


def role_of(name: str) -> str | None:
    """The role ``name`` suggests (a config field's name, a constructor parameter's), if any."""
    return next((role for role, names in ROLE_NAMES if name in names), None)


def roles_named(names: list[tuple[str, bool]], prefix: str = "",
                roles: ConstructorRoles | None = None) -> ConstructorRoles:
    """Roles for ``names`` (each with whether it is required), the first name of each role
    taking it; a required name no role takes is ``unknown``. ``prefix`` is put before each name
    (``"config."``: fields of a config object), and ``roles`` are added to where given."""
    roles = roles if roles is not None else ConstructorRoles()
    for name, required in names:
        role = role_of(name)
        if role is not None and getattr(roles, role) is None:
            setattr(roles, role, prefix + name)
        elif required:  # no role, or one an earlier name took
            roles.unknown.append(prefix + name)
    return roles
