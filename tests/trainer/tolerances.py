"""Comparing float tensors that two code paths computed: against the tensor's scale, not per element.

Two exact computations in float32 that sum in another order (a shared prefix against a whole row,
another set of CPU kernels, another thread count) differ by a few units in the last place of the
LARGEST terms they add, and that difference lands on small entries too. A per-element `rtol` then
fails on a small entry next to a large one although both paths are right; a bug, on the other hand,
moves entries by a sizeable share of the tensor's scale. So: max |actual - expected| <= rel * scale,
where scale is max |expected| (at least `floor`, so an all-zero tensor is compared absolutely).
"""

from __future__ import annotations

import torch

__all__ = ["assert_close_to_scale"]


def assert_close_to_scale(actual: torch.Tensor, expected: torch.Tensor, *, rel: float = 1e-5, floor: float = 1.0,
                          what: str = "tensor") -> None:
    actual, expected = torch.as_tensor(actual), torch.as_tensor(expected)
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    if actual.numel() == 0:
        return
    a, e = actual.detach().double(), expected.detach().double()
    assert bool(torch.isfinite(a).all() == torch.isfinite(e).all()), f"{what}: non-finite entries differ"
    scale = max(float(e.abs().max()), floor)
    error = float((a - e).abs().max())
    assert error <= rel * scale, f"{what}: max |difference| {error:.3g} > {rel:g} x scale {scale:.3g}"
