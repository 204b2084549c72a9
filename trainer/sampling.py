"""A transformers policy that plays turns in token space: what the local trainer rolls out with.

`HFPolicyAgent` samples the turns of all live episodes in one batched decoding loop with a KV cache.
Its contexts are built in token space (token-in, token-out, as OpenRLHF and verl do):

- the first turn's prompt, and every prompt of a `window:k` context, is the chat rendered with
  `trainer.chat.ChatFraming.prompt_ids`;
- in a full chat, the context of turn k + 1 is the context of turn k, the ids sampled in turn k
  (its stop id included) and `ChatFraming.feedback_ids` of the observation: the ids sampled are
  never decoded and encoded again, so the model reads back exactly what it wrote.

Every turn is recorded as a `TurnTokens` (`samples`, then `annotate(episodes)` attaches them to the
turns): the context ids added before it, the sampled ids with the stop id the model sampled (any of
`stop_ids`: the template's end-of-turn token, the tokenizer's eos, the generation config's eos ids),
their sampling log-probs and the finish reason. `trainer.rows.build_rows` lays rows out from these
records, so the update trains on exactly the ids that were sampled, in exactly their context.

Sampling draws from the model's plain distribution (softmax of logits / temperature: no top-k,
top-p or repetition penalty, so the log-probs a trainer recomputes at the same temperature are those
of the sampling policy) with the agent's own seeded `torch.Generator`; temperature 0 is greedy.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from agentgym_opsd.context import Message
from agentgym_opsd.contract import TextEnv
from agentgym_opsd.episode import TurnTokens
from trainer.chat import framing_for
from trainer.policy import end_of_turn_ids

__all__ = ["HFPolicyAgent", "DEFAULT_TURN_TOKENS"]

# The per-turn token cap for an env that does not name one (`TextEnv.max_turn_tokens`'s default).
DEFAULT_TURN_TOKENS = 256


class HFPolicyAgent:
    """A transformers causal LM that writes turns, batched over all live episodes.

    Args:
        model, tokenizer: the policy (the tokenizer needs a chat template).
        max_new_tokens: the per-turn token cap; a turn that reaches it ends there. None: each env's
            own `max_turn_tokens` (256 for an env without one).
        temperature: sampling temperature; 0 is greedy.
        seed: seed of the agent's sampling generator.
        chat_template_kwargs: extra keywords for `apply_chat_template` (e.g. `enable_thinking`).
        max_batch: at most this many prompts per decoding call (None: all of them at once).
        name: the agent's name in episode records.
        reuse_prefix: keep each episode's keys and values from one turn to the next and compute only
            the new part of its context. Off for models whose caches are not plain (sliding windows).
        stop_at_action_close: also end a turn once it has written its env's closing action tag
            (`</action>`, `</search>`, `</answer>`: the env's `action_tags`), since a turn holds one
            action (finish reason `action`: no stop id was sampled; the next context closes the turn
            with the template's end-of-turn text). Off by default: the trainer samples turns that end
            at a stop id.

    `stats` counts prompts, prompt and generated tokens, turns cut at the cap, turns ended at the
    action's closing tag and seconds spent.
    `state_dict()` / `load_state_dict()` save and restore the sampling generator (exact resume).
    """

    def __init__(
        self,
        model,
        tokenizer,
        *,
        max_new_tokens: int | None = 128,
        temperature: float = 1.0,
        seed: int = 0,
        chat_template_kwargs: dict[str, Any] | None = None,
        max_batch: int | None = None,
        name: str = "hf",
        reuse_prefix: bool = True,
        stop_at_action_close: bool = False,
    ) -> None:
        import torch

        if max_new_tokens is not None and max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {temperature}")
        self.model = model
        self.tokenizer = tokenizer
        self.max_new_tokens = None if max_new_tokens is None else int(max_new_tokens)
        self.stop_at_action_close = bool(stop_at_action_close)
        self.temperature = float(temperature)
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.framing = framing_for(tokenizer, **self.chat_template_kwargs)
        self.max_batch = max_batch
        self.name = name
        self.reuse_prefix = bool(reuse_prefix)
        self.stop_ids = end_of_turn_ids(tokenizer, model)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.stop_ids[0]
        self.device = next(model.parameters()).device
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(int(seed))
        # Per live episode: its messages and context ids at its last turn, and what it sampled.
        self._contexts: dict[str, tuple[list[Message], list[int], list[int], bool]] = {}
        self._prefixes: dict[str, tuple[list[int], list]] = {}
        self.samples: dict[tuple[str, int], TurnTokens] = {}
        self.stats = self._zero_stats()

    # -- the agent protocol -----------------------------------------------------------------

    def act(self, messages: list[Message], info: dict[str, Any], env: TextEnv) -> str:
        return self.act_batch([messages], [info], [env])[0]

    def act_batch(
        self, messages: Sequence[list[Message]], infos: Sequence[dict[str, Any]], envs: Sequence[TextEnv]
    ) -> list[str]:
        keys = [getattr(info.get("step"), "episode_id", None) for info in infos]
        # Episodes not in this tick have ended: their contexts and cached prefixes go.
        live = set(keys)
        for table in (self._contexts, self._prefixes):
            for key in [k for k in table if k not in live]:
                del table[key]
        contexts, added = [], []
        for m, key in zip(messages, keys, strict=True):
            context, new, extends = self._context(m, key)
            contexts.append(context)
            added.append((new, extends))
        limits = [self.turn_cap(env) for env in envs]
        closers = [self.closing_tags(env) for env in envs]
        out: list[str] = []
        step = self.max_batch or len(contexts) or 1
        sampled: list[tuple[list[int], list[float], str]] = []
        for start in range(0, len(contexts), step):
            window = slice(start, start + step)
            sampled += self._sample(contexts[window], keys[window], limits[window], closers[window])
        for m, key, info, context, (new, extends), (ids, lps, finish) in zip(
            messages, keys, infos, contexts, added, sampled, strict=True
        ):
            text, _, closed = self.framing.split_response(ids, self.stop_ids if finish == "stop" else ())
            out.append(text)
            if key is not None:
                self._contexts[key] = (list(m) + [{"role": "assistant", "content": text}], context, ids, closed)
            step_info = info.get("step")
            if step_info is not None:
                self.samples[(step_info.episode_id, int(step_info.turn))] = TurnTokens(
                    prompt_ids=new, extends=extends, sampled_ids=ids, logprobs=lps, finish_reason=finish,
                )
        return out

    def turn_cap(self, env: Any = None) -> int:
        """The token cap of a turn in `env`: the agent's own, else the env's `max_turn_tokens`."""
        if self.max_new_tokens is not None:
            return self.max_new_tokens
        cap = getattr(env, "max_turn_tokens", None) if env is not None else None
        return int(cap) if isinstance(cap, int) and not isinstance(cap, bool) and cap > 0 else DEFAULT_TURN_TOKENS

    def closing_tags(self, env: Any = None) -> tuple[str, ...]:
        """The texts that end a turn in `env` besides a stop id (none unless `stop_at_action_close`)."""
        if not self.stop_at_action_close or env is None:
            return ()
        tags = getattr(env, "action_tags", None) or ()
        return tuple(f"</{tag}>" for tag in tags if isinstance(tag, str) and tag)

    def annotate(self, episodes) -> int:
        """Attach each turn's `TurnTokens` record (and `turn.info["finish_reason"]`) to the episodes
        played through `act_batch`, and forget them; returns how many turns got one."""
        n = 0
        for episode in episodes:
            for k, turn in enumerate(episode.turns):
                record = self.samples.pop((episode.episode_id, k), None)
                if record is not None:
                    turn.tokens = record
                    turn.info["finish_reason"] = record.finish_reason
                    n += 1
        return n

    # -- contexts in token space ------------------------------------------------------------

    def _context(self, messages: list[Message], key: str | None) -> tuple[list[int], list[int], bool]:
        """(the context ids of this turn, the ids added since the previous turn, whether it extends).

        A chat that is the previous turn's chat plus that turn's response and one user message (a
        full-chat context) extends the previous context in token space; anything else is rendered.
        """
        previous = self._contexts.get(key) if key is not None else None
        if previous is not None:
            seen, context, sampled, closed = previous
            if len(messages) == len(seen) + 1 and messages[:-1] == seen and messages[-1].get("role") == "user":
                added = self.framing.feedback_ids(messages[-1]["content"], closed)
                return context + sampled + added, added, True
        ids = self.framing.prompt_ids(list(messages))
        return ids, ids, False

    def prompt_ids(self, messages: list[Message]) -> list[int]:
        """The ids of a chat's prompt, rendered afresh (assistant messages verbatim)."""
        return self.framing.prompt_ids(list(messages))

    # -- decoding ---------------------------------------------------------------------------

    def sample(self, prompts: Sequence[Sequence[int]]) -> list[tuple[list[int], list[float]]]:
        """Decode one turn for each prompt (token ids): the generated ids, ending with the stop id
        when the model stopped, and their log-probs under the sampling distribution."""
        return [(ids, lps) for ids, lps, _ in self._sample(prompts)]

    def _sample(
        self,
        prompts: Sequence[Sequence[int]],
        keys: Sequence[str | None] | None = None,
        limits: Sequence[int] | None = None,
        closers: Sequence[tuple[str, ...]] | None = None,
    ) -> list[tuple[list[int], list[float], str]]:
        import torch

        if not prompts:
            return []
        started = time.perf_counter()
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
                result = self._decode(
                    prompts,
                    list(keys) if keys is not None else [None] * len(prompts),
                    list(limits) if limits is not None else [self.turn_cap()] * len(prompts),
                    list(closers) if closers is not None else [()] * len(prompts),
                )
        finally:
            self.model.train(was_training)
        self.stats["calls"] += 1
        self.stats["prompts"] += len(prompts)
        self.stats["prompt_tokens"] += sum(len(p) for p in prompts)
        self.stats["new_tokens"] += sum(len(ids) for ids, _, _ in result)
        self.stats["capped_turns"] += sum(1 for _, _, finish in result if finish == "length")
        self.stats["closed_turns"] += sum(1 for _, _, finish in result if finish == "action")
        self.stats["seconds"] += time.perf_counter() - started
        return result

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
        import torch

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
        from trainer.forward import masked_attention  # SDPA with grouped key/value heads on the CPU

        with masked_attention(self.model):
            if prefill:  # logits of the last position only
                try:
                    return self.model(**kwargs, logits_to_keep=1)
                except TypeError:  # a model without logits_to_keep
                    pass
            return self.model(**kwargs)

    # -- bookkeeping ------------------------------------------------------------------------

    @staticmethod
    def _zero_stats() -> dict[str, float]:
        return {"calls": 0, "prompts": 0, "prompt_tokens": 0, "prefill_tokens": 0, "new_tokens": 0, "capped_turns": 0,
                "closed_turns": 0, "seconds": 0.0}

    def pop_stats(self) -> dict[str, float]:
        """The counters since the last call, reset to zero."""
        stats, self.stats = self.stats, self._zero_stats()
        return stats

    def state_dict(self) -> dict[str, Any]:
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.generator.set_state(state["generator"])
