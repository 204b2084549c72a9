"""Keys and values of the episodes a sampler plays: one preallocated slot per episode, written in place.

A rollout decodes many episodes turn after turn. Each episode owns a slot: per layer, a row of a
[slots, key/value heads, capacity, head dim] buffer that holds the keys and values of its context so
far, positions 0..length-1. A forward writes the new tokens' keys and values into their slots at the
slots' own positions (no concatenation, no per-step copy of the cache), and attention reads each
row's slot up to its own length (no padding to the longest row):

    forward rows b = 1..B, row b on slot s_b, its real tokens written at positions p_b .. p_b + n_b - 1
    attention of row b's query at position p:  softmax(q K[s_b, :, lo:p+1]^T * scale) V[s_b, :, lo:p+1]
    lo = 0, or p + 1 - window for a sliding-window layer

Rows may be any subset of the slots, in any order: an episode that stopped early in a turn drops out of
the forward without moving anyone's keys. The forward's input is left-padded ([B, W], a row's real
tokens are its last n_b columns), so every row's last column is its last token, whose logits are the
only ones kept; the padding columns are computed but neither written nor read.

`SlotCache` is what the model gets as `past_key_values` (its `update` is the only method transformers
calls when positions and the mask are given), and `slot_attention` is registered as a transformers
attention implementation that reads it: inside `SlotCache.forward(model, ...)` every attention layer
of the model runs it. Models whose attention goes through transformers' attention interface (Llama,
Qwen2/2.5/3, Mistral, ...) work; the first forward checks that every layer did.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch

from trainer.forward import AttentionImplementationSetTo, decoder_and_head

__all__ = ["SlotCache", "SlotCacheError", "SLOT_ATTENTION"]

SLOT_ATTENTION = "agentgym_opsd_slots"


class SlotCacheError(RuntimeError):
    """The model cannot be sampled through slots (its attention bypasses transformers' interface, or
    uses a feature the slot attention does not implement); the message says which."""


class _SlotKV:
    """What `SlotCache.update` hands to the attention: one layer's key or value buffer and the cache
    (which knows each forward row's slot and positions)."""

    __slots__ = ("buffer", "cache")

    def __init__(self, buffer: torch.Tensor, cache: SlotCache) -> None:
        self.buffer, self.cache = buffer, cache


class SlotCache:
    """Per-layer key and value buffers for `slots` sequences of up to `capacity` positions.

    `lengths[s]`: how many positions of slot s hold keys and values (the sampler sets it). The buffers
    are made at the first write (their head counts, head dims and dtype are the model's) and grow, by
    copying once, when a forward writes past the capacity.
    """

    def __init__(self, slots: int, capacity: int = 256) -> None:
        self.slots = int(slots)
        self.capacity = int(capacity)
        self.keys: list[torch.Tensor | None] = []
        self.values: list[torch.Tensor | None] = []
        self.lengths = [0] * self.slots
        # The forward in progress (`begin`): each row's slot, first written position and real tokens.
        self.rows: list[int] = []
        self.starts: list[int] = []
        self.counts: list[int] = []
        self.width = 0
        self._index: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        self.attended_layers = 0

    def nbytes(self) -> int:
        """Bytes the key and value buffers take."""
        return sum(buf.numel() * buf.element_size() for table in (self.keys, self.values) for buf in table
                   if buf is not None)

    # -- slots ------------------------------------------------------------------------------------

    def add_slots(self, n: int) -> None:
        """Make room for `n` more slots (copies the buffers once)."""
        self.slots += n
        self.lengths += [0] * n
        for table in (self.keys, self.values):
            for i, buf in enumerate(table):
                if buf is not None:
                    grown = buf.new_empty((self.slots, *buf.shape[1:]))
                    grown[: buf.shape[0]] = buf
                    table[i] = grown

    def copy_positions(self, source: int, targets: Sequence[int], start: int, end: int) -> None:
        """Copy positions start..end-1 of slot `source` into each slot of `targets`."""
        if end <= start or not targets:
            return
        index = torch.tensor(list(targets), dtype=torch.long)
        for table in (self.keys, self.values):
            for buf in table:
                if buf is not None:
                    buf[index, :, start:end] = buf[source, :, start:end]

    def _ensure_capacity(self, needed: int) -> None:
        if needed <= self.capacity:
            return
        capacity = max(needed, self.capacity + self.capacity // 2)
        capacity = -(-capacity // 64) * 64
        for table in (self.keys, self.values):
            for i, buf in enumerate(table):
                if buf is not None:
                    grown = buf.new_empty((*buf.shape[:2], capacity, buf.shape[3]))
                    grown[:, :, : self.capacity] = buf
                    table[i] = grown
        self.capacity = capacity

    # -- one forward ------------------------------------------------------------------------------

    def begin(self, rows: Sequence[int], starts: Sequence[int], counts: Sequence[int], width: int) -> None:
        """Before a forward of [len(rows), width] left-padded tokens: row b runs on slot rows[b], and its
        last counts[b] columns are real tokens at positions starts[b] ... (the rest is padding)."""
        self.rows, self.starts, self.counts, self.width = list(rows), list(starts), list(counts), int(width)
        self._ensure_capacity(max(s + c for s, c in zip(self.starts, self.counts, strict=True)))
        # Where each real token's key and value go: (slot, position) <- (forward row, column).
        slot_i, pos_i, row_i, col_i = [], [], [], []
        for b, (slot, start, count) in enumerate(zip(self.rows, self.starts, self.counts, strict=True)):
            slot_i += [slot] * count
            pos_i += range(start, start + count)
            row_i += [b] * count
            col_i += range(width - count, width)
        self._index = tuple(torch.tensor(x, dtype=torch.long) for x in (slot_i, pos_i, row_i, col_i))
        self.attended_layers = 0

    def update(self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, *args, **kwargs):
        """Write the forward's new keys and values ([rows, heads, width, head dim]) into their slots;
        returns the handles `slot_attention` reads."""
        while len(self.keys) <= layer_idx:
            self.keys.append(None)
            self.values.append(None)
        out = []
        for table, new in ((self.keys, key), (self.values, value)):
            buf = table[layer_idx]
            if buf is None:
                buf = new.new_empty((self.slots, new.shape[1], self.capacity, new.shape[3]))
                table[layer_idx] = buf
            slot_i, pos_i, row_i, col_i = self._index
            buf[slot_i, :, pos_i] = new.transpose(1, 2)[row_i, col_i].to(buf.dtype)
            out.append(_SlotKV(buf, self))
        return out[0], out[1]

    def forward(self, model, input_ids: torch.Tensor, positions: torch.Tensor, rows: Sequence[int],
                starts: Sequence[int], counts: Sequence[int], *, every_position: bool = False,
                logits: bool = True) -> torch.Tensor | None:
        """Run `model` on left-padded `input_ids` [B, W] (row b's real tokens: its last counts[b] columns, at
        positions starts[b]...) with this cache. Returns the logits of every row's last column, [B, V], or
        with `every_position` those of every real token, [sum(counts), V], row by row; with `logits` False
        only the keys and values are written (nothing is returned)."""
        self.begin(rows, starts, counts, input_ids.shape[1])
        _register()
        decoder, head = decoder_and_head(model)
        kwargs = dict(input_ids=input_ids, position_ids=positions, past_key_values=self, use_cache=True)
        _, _, row_i, col_i = self._index
        with AttentionImplementationSetTo(model.config, SLOT_ATTENTION):
            if decoder is not None:  # the head only where logits are read
                hidden = decoder(**kwargs).last_hidden_state
                out = head(hidden[row_i, col_i] if every_position else hidden[:, -1]) if logits else None
            else:
                out = model(**kwargs).logits
                out = out[row_i, col_i] if every_position else out[:, -1]
        config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        layers = int(getattr(config, "num_hidden_layers", 0) or len(self.keys))
        if self.attended_layers != layers or layers == 0:
            raise SlotCacheError(
                f"{type(model).__name__}: {self.attended_layers} of its {layers} attention layers went through "
                "transformers' attention interface; the slot sampler needs all of them (a model with custom "
                "attention code is not supported)")
        return out


def slot_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """Attention of every forward row over its own slot (see the module docstring); `query` is
    [rows, query heads, width, head dim] and the result [rows, width, query heads, head dim], as
    transformers' attention functions return it. Padding columns get zeros."""
    if not isinstance(key, _SlotKV):
        raise SlotCacheError("slot attention ran without the slot cache (was the model called outside "
                             "SlotCache.forward?)")
    for name in ("softcap", "s_aux", "sinks"):
        if kwargs.get(name) is not None:
            raise SlotCacheError(f"{type(module).__name__} uses attention {name!r}, which the slot sampler "
                                 "does not implement")
    cache = key.cache
    cache.attended_layers += 1
    window = kwargs.get("sliding_window")
    rows, heads, width, dim = query.shape
    kv_heads = key.buffer.shape[1]
    groups = heads // kv_heads
    out = query.new_zeros(rows, heads, width, value.buffer.shape[3])
    sdpa = torch.nn.functional.scaled_dot_product_attention
    for b, (slot, start, count) in enumerate(zip(cache.rows, cache.starts, cache.counts, strict=True)):
        end = start + count
        lo = max(0, end - count + 1 - window) if window else 0
        k = key.buffer[slot, :, lo:end].unsqueeze(0)
        v = value.buffer[slot, :, lo:end].unsqueeze(0)
        if count == 1:  # one query attends every key: the grouped query heads as queries of their key head
            q = query[b, :, width - 1].reshape(1, kv_heads, groups, dim)
            out[b, :, width - 1] = sdpa(q, k.to(q.dtype), v.to(q.dtype), scale=scaling).reshape(heads, -1)
            continue
        # the row's queries at positions start..end-1 see keys lo..p (and, in a window, past p - window)
        key_pos = torch.arange(lo, end)
        query_pos = torch.arange(start, end)[:, None]
        mask = key_pos[None] <= query_pos
        if window:
            mask &= key_pos[None] > query_pos - window
        q = query[b : b + 1, :, width - count :]
        out[b, :, width - count :] = sdpa(q, k.to(q.dtype), v.to(q.dtype), attn_mask=mask, scale=scaling,
                                          enable_gqa=groups > 1)[0]
    return out.transpose(1, 2).contiguous(), None


@functools.cache
def _register() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(SLOT_ATTENTION, slot_attention)
