from .layers import CausalSelfAttention, MultiHeadAttention

__all__ = ["CausalSelfAttention", "MultiHeadAttention"]
