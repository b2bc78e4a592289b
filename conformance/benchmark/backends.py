"""Torch's own SDPA backends as bench rows, beside the implementation: each forced alone with
``torch.nn.attention.sdpa_kernel`` (FLASH, EFFICIENT, CUDNN, MATH), the rest of the layer the
reference's. A backend the device, dtype or shape has no kernel for is a skipped row with
torch's reason, as any implementation that fails a length."""

from __future__ import annotations

from dataclasses import replace

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from conformance.model.spec import Implementation

BACKENDS = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
            "cudnn": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH}


class _Forced(torch.nn.Module):
    """The reference layer with its SDPA call held to one backend."""

    def __init__(self, inner: torch.nn.Module, backend: SDPBackend) -> None:
        super().__init__()
        self.inner, self.backend = inner, backend

    def forward(self, *args, **kwargs):
        with sdpa_kernel([self.backend]):
            return self.inner(*args, **kwargs)


def backend_rows(reference: Implementation) -> list[Implementation]:
    """``reference`` once per SDPA backend, named ``sdpa[flash]`` and so on."""
    return [replace(reference, name=f"sdpa[{name}]", weight_layout=None,
                    factory=lambda config, backend=backend: _Forced(reference.factory(config),
                                                                    backend),
                    description=f"F.scaled_dot_product_attention held to {name}")
            for name, backend in BACKENDS.items()]
