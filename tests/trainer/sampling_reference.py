"""The sampler as it was before the slot cache (commit 2a4e315's `trainer/sampling.py` decoding loop): the
yardstick `test_sampler_equivalence.py` holds the slot sampler against.

Each call rebuilt a left-padded transformers `DynamicCache` from every episode's kept keys and values
(cloned per episode after each turn), decoded with the cache growing by concatenation, and sampled
every row at every step. Only the decoding differs from `trainer.sampling.HFPolicyAgent`; contexts,
stop rules and records are the agent's own.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from trainer.forward import masked_attention
from trainer.sampling import HFPolicyAgent


class ReferenceSampler(HFPolicyAgent):
    """`HFPolicyAgent` with the decoding loop of 2a4e315."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._prefixes: dict[str, tuple[list[int], list]] = {}
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.stop_ids[0]

    def act_batch(self, messages, infos, envs):
        live = {getattr(info.get("step"), "episode_id", None) for info in infos}
        for key in [k for k in self._prefixes if k not in live]:
            del self._prefixes[key]
        return super().act_batch(messages, infos, envs)

    def end_rollout(self) -> None:
        super().end_rollout()
        self._prefixes.clear()

    def _decode(
        self, prompts: Sequence[Sequence[int]], keys: list[str | None], limits: list[int],
        closers: list[tuple[str, ...]],
    ) -> list[tuple[list[int], list[float], str]]:
        """One batched decoding loop with a KV cache. Row i stops at a stop id, at a text of
        `closers[i]` (the token that completes it is kept), or after `limits[i]` tokens.

        Layout: row i is `[pad, reused prefix (n_i), pad, new prompt tokens, generated tokens]`, every
        row's next token in the same column. The reused prefix is the longest common prefix of the
        prompt with the ids this episode's cache holds from its previous turn (a full-chat context
        extends the previous one); its keys and values are not recomputed. Padding is masked out and
        positions are explicit, so a row's logits do not depend on the others.

        Returns per prompt: (sampled ids, the stop id included when sampled; their log-probs; the
        finish reason: `stop`, `action` (a closing tag) or `length`).
        """
        batch = len(prompts)
        reused = [self._reusable(p, key) for p, key in zip(prompts, keys, strict=True)]
        past = max(n for n, _ in reused)
        fresh = [list(p[n:]) for p, (n, _) in zip(prompts, reused, strict=True)]
        width = max(len(f) for f in fresh)
        input_ids = torch.full((batch, width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((batch, past + width), dtype=torch.long)
        positions = torch.zeros((batch, width), dtype=torch.long)
        for i, (f, (n, _)) in enumerate(zip(fresh, reused, strict=True)):
            if f:
                input_ids[i, width - len(f) :] = torch.tensor(f, dtype=torch.long)
                mask[i, past + width - len(f) :] = 1
                positions[i, width - len(f) :] = torch.arange(n, n + len(f))
            mask[i, past - n : past] = 1
        input_ids, mask, positions = input_ids.to(self.device), mask.to(self.device), positions.to(self.device)
        cache = self._past_cache(reused, past) if past else None
        self.stats["prefill_tokens"] += int(batch * width)
        stop = torch.tensor(self.stop_ids, device=self.device)
        out = self._forward(input_ids, mask, positions, cache, prefill=True)
        cache, logits = out.past_key_values, out.logits[:, -1].float()
        next_position = positions[:, -1] + 1
        done = torch.zeros(batch, dtype=torch.bool, device=self.device)
        limit = torch.tensor(limits, device=self.device)
        closed = [False] * batch  # ended at a closing action tag
        tails = [""] * batch  # the end of each row's text so far, to spot a closing tag
        watch = [i for i in range(batch) if closers[i]]
        horizon = max(limits)
        tokens: list[torch.Tensor] = []
        logps: list[torch.Tensor] = []
        for t in range(horizon):
            if self.temperature == 0:
                logp = torch.log_softmax(logits, dim=-1)
                token = logits.argmax(dim=-1)
            else:
                logp = torch.log_softmax(logits / self.temperature, dim=-1)
                token = torch.multinomial(logp.exp(), 1, generator=self.generator).squeeze(-1)
            was_done = done
            tokens.append(torch.where(done, torch.full_like(token, -1), token))
            logps.append(logp.gather(-1, token[:, None]).squeeze(-1))
            done = done | torch.isin(token, stop)
            if watch:
                values, ended = token.tolist(), was_done.tolist()
                for i in watch:
                    if not ended[i] and not closed[i] and values[i] not in self.stop_ids:
                        tails[i] = (tails[i] + self.tokenizer.decode([values[i]], skip_special_tokens=False))[-64:]
                        closed[i] = any(c in tails[i] for c in closers[i])
                if any(closed):
                    done = done | torch.tensor(closed, device=self.device)
            done = done | (t + 1 >= limit)
            if bool(done.all()) or t + 1 == horizon:
                break
            mask = torch.cat([mask, torch.ones((batch, 1), dtype=mask.dtype, device=self.device)], dim=1)
            out = self._forward(token[:, None], mask, next_position[:, None], cache)
            cache, logits = out.past_key_values, out.logits[:, -1].float()
            next_position = next_position + 1
        table = torch.stack(tokens, dim=1).tolist()
        lp_table = torch.stack(logps, dim=1).tolist()
        stop_set = set(self.stop_ids)
        result = []
        for i, (row, lps) in enumerate(zip(table, lp_table, strict=True)):
            ids: list[int] = []
            values: list[float] = []
            finish = "length"
            for token, lp in zip(row, lps, strict=True):
                if token < 0:
                    break
                ids.append(int(token))
                values.append(float(lp))
                if token in stop_set:
                    finish = "stop"
                    break
                if len(ids) >= limits[i]:
                    break
            if finish == "length" and closed[i]:
                finish = "action"
            result.append((ids, values, finish))
        self._keep_prefixes(prompts, keys, result, cache, mask)
        return result

    def _reusable(self, prompt: Sequence[int], key: str | None) -> tuple[int, Any]:
        """(tokens of `prompt` whose keys/values this episode's cache holds, the cache entry)."""
        entry = self._prefixes.get(key) if key is not None else None
        if entry is None:
            return 0, None
        ids, _ = entry
        n = 0
        limit = min(len(ids), len(prompt) - 1)  # at least one prompt token is run, for the next-token logits
        while n < limit and ids[n] == prompt[n]:
            n += 1
        return n, entry

    def _past_cache(self, reused: list[tuple[int, Any]], past: int):
        """A DynamicCache holding each row's reused prefix, left-padded to `past` positions."""
        from transformers import DynamicCache

        layers = []
        template = next(entry for n, entry in reused if n)[1]
        for layer, (k0, v0) in enumerate(template):
            keys = k0.new_zeros((len(reused), k0.shape[0], past, k0.shape[2]))
            values = v0.new_zeros((len(reused), v0.shape[0], past, v0.shape[2]))
            for i, (n, entry) in enumerate(reused):
                if n:
                    k, v = entry[1][layer]
                    keys[i, :, past - n :] = k[:, :n]
                    values[i, :, past - n :] = v[:, :n]
            layers.append((keys, values))
        return DynamicCache(ddp_cache_data=layers, config=self.model.config)

    def _keep_prefixes(self, prompts, keys, result, cache, mask) -> None:
        """Keep, per episode, the keys/values of its prompt and generated tokens for its next turn."""
        if not self.reuse_prefix or cache is None:
            return
        layers = getattr(cache, "layers", None)
        if not layers or any(type(layer).__name__ != "DynamicLayer" for layer in layers):
            self.reuse_prefix = False  # sliding-window or other caches: no reuse
            return
        if layers[0].keys.shape[-2] != mask.shape[1]:
            return
        for i, (prompt, key, (ids, _, _)) in enumerate(zip(prompts, keys, result, strict=True)):
            if key is None:
                continue
            held = list(prompt) + ids[:-1]  # the last sampled id (stop or capped) was never fed
            positions = mask[i].nonzero().squeeze(1)[: len(held)]
            if positions.numel() < len(held):
                held = held[: positions.numel()]
            self._prefixes[key] = (
                held,
                [(layer.keys[i][:, positions].clone(), layer.values[i][:, positions].clone()) for layer in layers],
            )

    def _forward(self, input_ids, mask, positions, cache, *, prefill: bool = False):
        kwargs = dict(input_ids=input_ids, attention_mask=mask, position_ids=positions, use_cache=True)
        if cache is not None:
            kwargs["past_key_values"] = cache
        with masked_attention(self.model):
            if prefill:  # logits of the last position only
                try:
                    return self.model(**kwargs, logits_to_keep=1)
                except TypeError:  # a model without logits_to_keep
                    pass
            return self.model(**kwargs)
