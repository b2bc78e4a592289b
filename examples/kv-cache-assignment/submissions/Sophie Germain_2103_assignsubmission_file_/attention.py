import torch
from torch import nn

from head import attend_one_head


class CachedSelfAttention(nn.Module):
    """I loop over the heads to keep it readable."""

    def __init__(self, d_model, num_heads):
        super().__init__()
        self.num_heads = num_heads
        self.head_size = d_model // num_heads
        self.query = nn.Linear(d_model, d_model)
        self.key = nn.Linear(d_model, d_model)
        self.value = nn.Linear(d_model, d_model)
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, x, past_kv=None):
        batch, new, _ = x.shape
        q = self.query(x)
        k_new = self.key(x).reshape(batch, new, self.num_heads, self.head_size).transpose(1, 2)
        v_new = self.value(x).reshape(batch, new, self.num_heads, self.head_size).transpose(1, 2)
        if past_kv is None:
            k_all, v_all = k_new, v_new
        else:
            k_all = torch.cat([past_kv[0], k_new], dim=2)
            v_all = torch.cat([past_kv[1], v_new], dim=2)
        offset = k_all.shape[2] - new
        heads = []
        for h in range(self.num_heads):
            q_h = q[:, :, h * self.head_size:(h + 1) * self.head_size]
            heads.append(attend_one_head(q_h, k_all[:, h], v_all[:, h], offset))
        return self.proj(torch.cat(heads, dim=-1)), (k_all, v_all)
