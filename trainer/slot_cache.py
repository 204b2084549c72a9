"""Keys and values of the episodes a sampler plays: one preallocated slot per episode, written in place.

A rollout decodes many episodes turn after turn. Each episode owns a slot: per layer, a row of a
[slots, key/value heads, capacity, head dim] buffer that holds the keys and values of its context so
far, positions 0..length-1. A forward writes the new tokens' keys and values into their slots at the
slots' own positions (no concatenation, no per-step copy of the cache), and attention reads each
segment's slot up to its own length (no padding to the longest episode):

    segments b = 1..B packed into one sequence, segment b's n_b tokens for slot s_b at positions p_b...
    a token of segment b at position p:  softmax(q K[s_b, :, lo:p+1]^T * scale) V[s_b, :, lo:p+1]
    lo = 0, or p + 1 - window for a sliding-window layer

The segments of a forward (the new tokens of each episode's context, or each episode's drawn token and
its guesses) are packed end to end into one [1, sum n_b] input, so the dense layers run exactly the
tokens there are, with no padding; positions are the slots' own. Any subset of the slots may run, in
any order: an episode that stopped early in a turn drops out without moving anyone's keys.

`SlotCache` is what the model gets as `past_key_values` (its `update` is the only method transformers
calls when positions and the mask are given), and `slot_attention` is registered as a transformers
attention implementation that reads it: inside `SlotCache.forward(model, ...)` every attention layer
of the model runs it. Models whose attention goes through transformers' attention interface (Llama,
Qwen2/2.5/3, Mistral, ...) work; every forward checks that each layer did.
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
    (which knows each segment's slot and positions)."""

    __slots__ = ("buffer", "cache")

    def __init__(self, buffer: torch.Tensor, cache: SlotCache) -> None:
        self.buffer, self.cache = buffer, cache


class SlotCache:
    """Per-layer key and value buffers for `slots` sequences of up to `capacity` positions.

    `lengths[s]`: how many positions of slot s hold keys and values (the sampler sets it). The buffers
    are made at the first write (their head counts, head dims and dtype are the model's) and grow, by
    copying once, when a forward writes past the capacity or more slots are added.
    """

    def __init__(self, slots: int, capacity: int = 256) -> None:
        self.slots = int(slots)
        self.capacity = int(capacity)
        self.keys: list[torch.Tensor | None] = []
        self.values: list[torch.Tensor | None] = []
        self.lengths = [0] * self.slots
        # The forward in progress (`begin`): each segment's slot, first position, token count and offset.
        self.segments: list[tuple[int, int, int, int]] = []
        self._index: tuple[torch.Tensor, torch.Tensor] | None = None
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

    def begin(self, slots: Sequence[int], starts: Sequence[int], counts: Sequence[int]) -> None:
        """Before a forward of segments packed end to end: segment b holds counts[b] tokens for slot
        slots[b], at positions starts[b]...; returns nothing, sets where each token's key and value go."""
        self.segments, offset = [], 0
        slot_i, pos_i = [], []
        for slot, start, count in zip(slots, starts, counts, strict=True):
            if count < 1:
                raise ValueError("a segment holds at least one token")
            self.segments.append((int(slot), int(start), int(count), offset))
            slot_i += [slot] * count
            pos_i += range(start, start + count)
            offset += count
        self._ensure_capacity(max(s + c for _, s, c, _ in self.segments))
        self._index = (torch.tensor(slot_i, dtype=torch.long), torch.tensor(pos_i, dtype=torch.long))
        self.attended_layers = 0

    def update(self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, *args, **kwargs):
        """Write the forward's new keys and values ([1, heads, tokens, head dim]) into their slots; returns
        the handles `slot_attention` reads."""
        while len(self.keys) <= layer_idx:
            self.keys.append(None)
            self.values.append(None)
        slot_i, pos_i = self._index
        out = []
        for table, new in ((self.keys, key), (self.values, value)):
            buf = table[layer_idx]
            if buf is None:
                buf = new.new_empty((self.slots, new.shape[1], self.capacity, new.shape[3]))
                table[layer_idx] = buf
            buf[slot_i, :, pos_i] = new[0].transpose(0, 1).to(buf.dtype)
            out.append(_SlotKV(buf, self))
        return out[0], out[1]

    def forward(self, model, segments: Sequence[Sequence[int]], slots: Sequence[int], starts: Sequence[int], *,
                every_position: bool = False, logits: bool = True, device=None) -> torch.Tensor | None:
        """Run `model` on `segments` (token ids; segment b for slot slots[b] at positions starts[b]...),
        packed into one sequence, with this cache. Returns the logits after each segment's last token,
        [B, V], or with `every_position` after each of its tokens, [sum of lengths, V], segment by
        segment; with `logits` False only the keys and values are written (returns None)."""
        counts = [len(s) for s in segments]
        self.begin(slots, starts, counts)
        _register()
        flat = [int(t) for s in segments for t in s]
        input_ids = torch.tensor([flat], dtype=torch.long, device=device)
        positions = torch.cat([torch.arange(p, p + n) for _, p, n, _ in self.segments])[None].to(device)
        decoder, head = decoder_and_head(model)
        kwargs = dict(input_ids=input_ids, position_ids=positions, past_key_values=self, use_cache=True)
        last = torch.tensor([o + n - 1 for _, _, n, o in self.segments], device=device)
        with AttentionImplementationSetTo(model.config, SLOT_ATTENTION):
            if decoder is not None:  # the head only where logits are read
                hidden = decoder(**kwargs).last_hidden_state[0]
                out = head(hidden if every_position else hidden[last]) if logits else None
            else:
                out = model(**kwargs).logits[0]
                out = out if every_position else out[last]
        config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        layers = int(getattr(config, "num_hidden_layers", 0) or len(self.keys))
        if self.attended_layers != layers or layers == 0:
            raise SlotCacheError(
                f"{type(model).__name__}: {self.attended_layers} of its {layers} attention layers went through "
                "transformers' attention interface; the slot sampler needs all of them (a model with custom "
                "attention code is not supported)")
        return out


def slot_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """Attention of every segment's tokens over their own slot (see the module docstring); `query` is
    [1, query heads, tokens, head dim] and the result [1, tokens, query heads, head dim], as
    transformers' attention functions return it."""
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
    _, heads, tokens, dim = query.shape
    kv_heads = key.buffer.shape[1]
    groups = heads // kv_heads
    out = query.new_empty(heads, tokens, value.buffer.shape[3])
    sdpa = torch.nn.functional.scaled_dot_product_attention
    for slot, start, count, offset in cache.segments:
        end = start + count
        lo = max(0, end - count + 1 - window) if window else 0
        k = key.buffer[slot, :, lo:end].unsqueeze(0)
        v = value.buffer[slot, :, lo:end].unsqueeze(0)
        if count == 1:  # one query attends every key: the grouped query heads as queries of their key head
            q = query[0, :, offset].reshape(1, kv_heads, groups, dim)
            out[:, offset] = sdpa(q, k.to(q.dtype), v.to(q.dtype), scale=scaling).reshape(heads, -1)
            continue
        # the segment's queries at positions start..end-1 see keys lo..p (and, in a window, past p - window)
        key_pos = torch.arange(lo, end)
        query_pos = torch.arange(start, end)[:, None]
        mask = key_pos[None] <= query_pos
        if window:
            mask &= key_pos[None] > query_pos - window
        q = query[:, :, offset : offset + count]
        out[:, offset : offset + count] = sdpa(q, k.to(q.dtype), v.to(q.dtype), attn_mask=mask, scale=scaling,
                                               enable_gqa=groups > 1)[0]
    return out.transpose(0, 1).unsqueeze(0), None


@functools.cache
def _register() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(SLOT_ATTENTION, slot_attention)
