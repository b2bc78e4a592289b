"""Reshaping helpers shared by attention.py."""


def split_heads(t, num_heads):
    b, n, d = t.shape
    return t.view(b, n, num_heads, d // num_heads).transpose(1, 2)


def merge_heads(t):
    b, h, n, dh = t.shape
    return t.transpose(1, 2).reshape(b, n, h * dh)
