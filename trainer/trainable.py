"""Which weights a run trains: all of them, the top k decoder layers, or low-rank adapters (peft).

A 135M model's full fine-tune on a CPU spends most of its time on the backward pass through every
layer and on weight gradients nobody needs for a small behavioural change. Two cheaper choices:

- `train_layers=k`: only the top k decoder layers and the final norm train; everything below runs
  forward only (no activations kept, no gradients), and the tied embedding stays frozen.
- `lora_rank=r`: peft's LoRA adapters of rank r on the attention and MLP projections of every layer
  (`lora_layers=0`) or of the top `lora_layers` layers; the base weights stay frozen. A saved model
  is merged (`merged_for_saving`): `OUT/model` is a plain transformers folder that `hf:` and
  `serve-policy` load like any other.

The loss, the credit and the token rows do not change: only which parameters the optimizer sees.
`trainable_state` / `load_trainable_state` keep checkpoints to the trained tensors when the rest is
the frozen base (a run resumes by loading the base, choosing the same weights, then these tensors).
benchmarks/train_speed.py measures each choice's tokens/s and quality side by side.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = [
    "TrainableError",
    "LORA_TARGETS",
    "select_trainable",
    "trains_everything",
    "trainable_names",
    "trainable_state",
    "load_trainable_state",
    "merged_for_saving",
    "decoder_layer_count",
]

# The projections LoRA adapts (Llama, Qwen2/3, Mistral names): attention and MLP.
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class TrainableError(ValueError):
    """The requested choice of trained weights does not fit the model; the message says how to fix it."""


def decoder_layer_count(model) -> int:
    layers = getattr(_base(model).get_decoder(), "layers", None)
    if layers is None:
        raise TrainableError(f"{type(model).__name__}: no decoder layers found (model.get_decoder().layers)")
    return len(layers)


def select_trainable(model, *, train_layers: int = 0, lora_rank: int = 0, lora_layers: int = 0,
                     lora_alpha: float = 0.0):
    """`model` with only the chosen weights trainable (requires_grad); a `PeftModel` for LoRA.

    Args:
        train_layers: 0 trains every weight; k > 0 only the top k decoder layers and the final norm.
        lora_rank: > 0 adds LoRA adapters of this rank (and trains only them); exclusive with train_layers.
        lora_layers: with LoRA, 0 adapts every layer; k > 0 the top k.
        lora_alpha: LoRA's scale numerator (0: twice the rank, peft's common choice).
    """
    if train_layers < 0 or lora_rank < 0 or lora_layers < 0:
        raise TrainableError("train_layers, lora_rank and lora_layers must be >= 0")
    if train_layers and lora_rank:
        raise TrainableError("choose one: train the top layers (--train-layers) or LoRA adapters (--lora-rank)")
    if lora_layers and not lora_rank:
        raise TrainableError("--lora-layers needs --lora-rank > 0")
    n = decoder_layer_count(model) if (train_layers or lora_layers) else 0
    for name, k in (("train_layers", train_layers), ("lora_layers", lora_layers)):
        if k > n:
            raise TrainableError(f"{name}={k}: the model has {n} decoder layers")
    if lora_rank:
        try:
            from peft import LoraConfig, get_peft_model
        except ImportError:
            raise TrainableError("LoRA needs peft: `.venv/bin/pip install peft` (`make setup` installs it)") from None
        present = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
        targets = [t for t in LORA_TARGETS if t in present]
        if not targets:
            raise TrainableError(f"{type(model).__name__}: none of the projections {LORA_TARGETS} found for LoRA")
        config = LoraConfig(r=int(lora_rank), lora_alpha=float(lora_alpha or 2 * lora_rank), lora_dropout=0.0,
                            target_modules=targets, bias="none",
                            layers_to_transform=list(range(n - lora_layers, n)) if lora_layers else None)
        return get_peft_model(model, config)
    if train_layers:
        model.requires_grad_(False)
        decoder = model.get_decoder()
        for layer in decoder.layers[n - train_layers:]:
            layer.requires_grad_(True)
        norm = getattr(decoder, "norm", None)
        if norm is not None:
            norm.requires_grad_(True)
    return model


def _base(model):
    """The transformers model under a peft wrapper (or the model itself)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def trains_everything(model) -> bool:
    return all(p.requires_grad for p in model.parameters())


def trainable_names(model) -> set[str]:
    """The state-dict names of the parameters the optimizer updates."""
    return {name for name, p in model.named_parameters() if p.requires_grad}


def trainable_state(model, names: set[str]) -> dict[str, torch.Tensor]:
    """The tensors of `model`'s state dict named in `names`: all of them when every weight of the
    policy trains, else the policy's trained ones (`trainable_names`), for the policy and its frozen
    copies alike."""
    return {k: v for k, v in model.state_dict().items() if k in names}


def load_trainable_state(model, state: dict[str, Any]) -> None:
    """Load `state` (whole, or the trained tensors only) into `model`; every tensor in it must land."""
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected:
        raise TrainableError(f"the checkpoint holds tensors this model does not have: {sorted(unexpected)[:3]}")
    if len(state) == len(model.state_dict()) and missing:
        raise TrainableError(f"the checkpoint lacks tensors of this model: {sorted(missing)[:3]}")


def merged_for_saving(model):
    """A plain transformers model with the adapters folded into the weights (for `save_pretrained`);
    the model itself when it has none. The live model keeps its adapters (the merge is on a copy)."""
    if not hasattr(model, "merge_and_unload"):
        return model
    import copy

    return copy.deepcopy(model).merge_and_unload()
