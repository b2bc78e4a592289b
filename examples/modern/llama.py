"""Modern attention as a user writes it, for the README's worked examples: a grouped-query layer
and a Llama-style block (grouped-query heads, rotary embeddings, a KV cache for generation), each
with a broken twin carrying one bug people ship.

    attention-conformance check examples/modern/llama.py::GQA examples/modern/llama.py::GQARepeat
    attention-conformance check examples/modern/llama.py::LlamaAttention
    attention-conformance check examples/modern/llama.py::LlamaAttentionIsCausal
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class GQA(nn.Module):
    """Grouped-query attention: n_heads query heads share n_kv_heads key/value heads."""

    def __init__(self, dim, n_heads, n_kv_heads=2):
        super().__init__()
        assert dim % n_heads == 0 and n_heads % n_kv_heads == 0
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, dim // n_heads
        self.wq = nn.Linear(dim, dim, bias=False)
        self.wk = nn.Linear(dim, n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(dim, n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)

    def expand(self, t):
        return t.repeat_interleave(self.n_heads // self.n_kv_heads, dim=1)

    def forward(self, x):
        b, t, _ = x.shape
        q = self.wq(x).view(b, t, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(b, t, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(b, t, self.n_kv_heads, self.head_dim).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, self.expand(k), self.expand(v))
        return self.wo(y.transpose(1, 2).reshape(b, t, -1))


class GQARepeat(GQA):
    """The broken twin: key/value heads tiled with repeat (query head h reads h mod n_kv_heads)."""

    def expand(self, t):
        return t.repeat(1, self.n_heads // self.n_kv_heads, 1, 1)


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class LlamaAttention(nn.Module):
    """A Llama block's attention: grouped-query heads, rotary embeddings at position_ids, an
    attention_mask of 1 = token, 0 = padding over every key (cached ones included), and the KV
    cache of HuggingFace's legacy API (past_key_value in; (output, present) out with
    use_cache=True)."""

    def __init__(self, hidden_size, num_heads, num_key_value_heads=None, rope_theta=10000.0):
        super().__init__()
        self.num_heads = num_heads
        self.num_kv = num_key_value_heads or num_heads
        self.head_dim = hidden_size // num_heads
        assert self.head_dim % 2 == 0, "RoPE needs an even head_dim"
        self.q_proj = nn.Linear(hidden_size, num_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(hidden_size, self.num_kv * self.head_dim, bias=False)
        self.v_proj = nn.Linear(hidden_size, self.num_kv * self.head_dim, bias=False)
        self.o_proj = nn.Linear(num_heads * self.head_dim, hidden_size, bias=False)
        inv_freq = 1.0 / rope_theta ** (torch.arange(0, self.head_dim, 2).float() / self.head_dim)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def attend(self, q, k, v, padding=None):
        """SDPA with the causal mask aligned bottom-right: the new tokens are the last ones."""
        q_len, kv_len = q.shape[-2], k.shape[-2]
        mask = torch.ones(q_len, kv_len, dtype=torch.bool, device=q.device).tril(kv_len - q_len)
        if padding is not None:
            mask = mask & padding[:, None, None, :].bool()
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    def forward(self, hidden_states, attention_mask=None, position_ids=None, past_key_value=None,
                use_cache=False):
        b, t, _ = hidden_states.shape
        past = 0 if past_key_value is None else past_key_value[0].shape[-2]
        q = self.q_proj(hidden_states).view(b, t, self.num_heads, -1).transpose(1, 2)
        k = self.k_proj(hidden_states).view(b, t, self.num_kv, -1).transpose(1, 2)
        v = self.v_proj(hidden_states).view(b, t, self.num_kv, -1).transpose(1, 2)
        if position_ids is None:
            position_ids = torch.arange(past, past + t, device=hidden_states.device)[None]
        freqs = position_ids[:, :, None].float() * self.inv_freq  # (B, T, head_dim / 2)
        emb = torch.cat((freqs, freqs), dim=-1)[:, None]
        cos, sin = emb.cos().to(q.dtype), emb.sin().to(q.dtype)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        if past_key_value is not None:
            k = torch.cat([past_key_value[0], k], dim=2)
            v = torch.cat([past_key_value[1], v], dim=2)
        present = (k, v)
        groups = self.num_heads // self.num_kv
        y = self.attend(q, k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1),
                        attention_mask)
        out = self.o_proj(y.transpose(1, 2).reshape(b, t, -1))
        return (out, present) if use_cache else out


class LlamaAttentionIsCausal(LlamaAttention):
    """The broken twin: is_causal=True handed to SDPA, which aligns the mask top-left."""

    def attend(self, q, k, v, padding=None):
        if padding is None:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return super().attend(q, k, v, padding)
