"""A transformers policy that plays turns in token space: what the local trainer rolls out with.

`HFPolicyAgent` samples the turns of all live episodes in one batched decoding loop. Each episode keeps
its keys and values in a slot of a preallocated cache (`trainer.slot_cache`) from its first turn to its
last, so a turn runs only the tokens its context added; the instructions that every new episode's
prompt starts with run once per rollout, and a group's identical first prompts once per group. Its
contexts are built in token space (token-in, token-out, as OpenRLHF and verl do):

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

import torch

from agentgym_opsd.context import Message
from agentgym_opsd.contract import TextEnv
from agentgym_opsd.episode import TurnTokens
from trainer.chat import framing_for
from trainer.policy import end_of_turn_ids
from trainer.slot_cache import SlotCache

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
            the new part of its context; run the common start of new episodes' prompts, and identical
            prompts, once. Off: every prompt runs whole (the plain reference, same turns up to float
            rounding).
        stop_at_action_close: also end a turn once it has written its env's closing action tag
            (`</action>`, `</search>`, `</answer>`: the env's `action_tags`), since a turn holds one
            action (finish reason `action`: no stop id was sampled; the next context closes the turn
            with the template's end-of-turn text). Off by default: the trainer samples turns that end
            at a stop id.
        draft_tokens: how many tokens a forward may guess after each row's drawn token (prompt lookup:
            what followed the last earlier place its context held its last two or three tokens); the
            guesses that agree with the draws save forwards, the ids and log-probs are the same (0: one
            token per forward).

    `stats` counts prompts, prompt tokens, prefilled tokens (those run before a turn's first draw),
    decoding forwards of a row (`decode_rows`), guessed tokens and the guesses that held, generated
    tokens, turns cut at the cap, turns ended at the action's closing tag and seconds spent.
    `end_rollout()` frees the keys and values (the rollout loop calls it when a rollout ends).
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
        draft_tokens: int = 4,
    ) -> None:
        if max_new_tokens is not None and max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {temperature}")
        if draft_tokens < 0:
            raise ValueError(f"draft_tokens must be >= 0, got {draft_tokens}")
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
        self.draft_tokens = int(draft_tokens)
        self.stop_ids = end_of_turn_ids(tokenizer, model)
        self.device = next(model.parameters()).device
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(int(seed))
        # Per live episode: its messages and context ids at its last turn, and what it sampled.
        self._contexts: dict[str, tuple[list[Message], list[int], list[int], bool]] = {}
        # Per live episode, its slot in the key/value cache (`trainer.slot_cache`), and per slot the ids
        # whose keys and values it holds; slots of finished episodes are free for the next ones.
        self._cache = None
        self._slot_of: dict[str, int] = {}
        self._held: dict[int, list[int]] = {}
        self._free: list[int] = []
        self.samples: dict[tuple[str, int], TurnTokens] = {}
        self.stats = self._zero_stats()

    # -- the agent protocol -----------------------------------------------------------------

    def act(self, messages: list[Message], info: dict[str, Any], env: TextEnv) -> str:
        return self.act_batch([messages], [info], [env])[0]

    def act_batch(
        self, messages: Sequence[list[Message]], infos: Sequence[dict[str, Any]], envs: Sequence[TextEnv]
    ) -> list[str]:
        keys = [getattr(info.get("step"), "episode_id", None) for info in infos]
        # Episodes not in this tick have ended: their contexts go, and their slots are free.
        live = set(keys)
        for key in [k for k in self._contexts if k not in live]:
            del self._contexts[key]
        for key in [k for k in self._slot_of if k not in live]:
            self._release_slot(self._slot_of.pop(key))
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
        except BaseException:
            self.end_rollout()  # the slots may be half written: no episode may reuse them
            raise
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
        """One batched decoding loop over the episodes' slots (`trainer.slot_cache`). Row i stops at a
        stop id, at a text of `closers[i]` (the token that completes it is kept), or after `limits[i]`
        tokens.

        1. Each row runs on its episode's slot, which holds the keys and values of the ids the episode
           read and wrote so far; the longest common prefix of those ids with the new prompt is reused
           (a full-chat context extends the previous one: only its new tokens run).
        2. Rows with nothing to reuse (new episodes) share the longest common prefix of their prompts
           (the instructions): it runs once, and its keys and values are copied into their slots.
        3. Rows with the same prompt and the same reused part (a group's first turn) run once; the
           others get copies of its keys, values and logits.
        4. Then each row still writing feeds the token it drew and, with `draft_tokens`, a guess of the
           tokens after it (the continuation of the last place its context held its last tokens): one
           forward gives the logits after each, its next tokens are drawn from them in order, and the
           guesses agree with the draws are kept (`_Turn`: the draws are exactly the one-token loop's).

        Returns per prompt: (sampled ids, the stop id included when sampled; their log-probs; the
        finish reason: `stop`, `action` (a closing tag) or `length`).
        """
        prompts = [list(p) for p in prompts]
        slots = self._assign_slots(keys, max(len(p) for p in prompts) + max(limits) + 64)
        logits = self._prefill(prompts, slots)
        turn = _Turn(self, prompts, limits, closers)
        fed = {i: (logits[i : i + 1], []) for i in range(len(prompts))}  # row: logits of its fed positions, guesses
        while fed:
            feed = {}
            for i, (tokens, logps) in turn.draw(fed).items():
                pending = turn.accept(i, tokens, logps, fed[i][1])
                if pending is not None:
                    feed[i] = [pending] + turn.guess(i)
            fed = self._feed(feed, slots, turn) if feed else {}
        result = turn.result()
        # Each slot now holds its prompt and the ids fed back (all but the last: a stop id or the cap's).
        for i, (key, slot, (ids, _, _)) in enumerate(zip(keys, slots, result, strict=True)):
            if key is None:
                self._release_slot(slot)
            else:
                self._held[slot] = prompts[i] + ids[:-1]
                self._cache.lengths[slot] = len(self._held[slot])
        return result

    def _feed(self, feed: dict[int, list[int]], slots: list[int], turn: _Turn) -> dict:
        """One forward of each row's drawn token and guesses at its slot's next positions; returns per row
        the logits after each of them and its guesses."""
        rows = list(feed)
        counts = [len(feed[i]) for i in rows]
        flat = self._cache.forward(self.model, [feed[i] for i in rows], [slots[i] for i in rows],
                                   [turn.position[i] for i in rows], every_position=True, device=self.device).float()
        self.stats["decode_rows"] += len(rows)
        self.stats["guessed_tokens"] += sum(counts) - len(rows)
        out, at = {}, 0
        for i, n in zip(rows, counts, strict=True):
            out[i] = (flat[at : at + n], feed[i][1:])
            turn.position[i] += 1  # the drawn token; `accept` adds the guesses that hold
            at += n
        return out

    # -- slots: where each episode's keys and values live ------------------------------------

    def _assign_slots(self, keys: list[str | None], capacity: int) -> list[int]:
        """The slot of each row: its episode's, or a free one (a row without an episode gets one for this
        call only)."""
        if self._cache is None:
            self._cache = SlotCache(0, capacity)
        missing = sum(1 for key in keys if key is None or key not in self._slot_of) - len(self._free)
        if missing > 0:
            first = self._cache.slots
            self._cache.add_slots(max(missing, self._cache.slots // 2))
            self._free += range(first, self._cache.slots)
        slots = []
        for key in keys:
            if key is not None and key in self._slot_of:
                slots.append(self._slot_of[key])
                continue
            slot = self._free.pop(0)
            self._held.pop(slot, None)
            if key is not None:
                self._slot_of[key] = slot
            slots.append(slot)
        return slots

    def _release_slot(self, slot: int) -> None:
        self._held.pop(slot, None)
        self._cache.lengths[slot] = 0
        self._free.append(slot)

    def end_rollout(self) -> None:
        """Forget every episode's context and free the keys and values (the rollout loop calls this when a
        rollout ends, so they do not outlive it)."""
        self._contexts.clear()
        self._slot_of.clear()
        self._held.clear()
        self._free = []
        self._cache = None

    def cache_bytes(self) -> int:
        """Bytes of keys and values the agent holds for the episodes it is playing (0 between rollouts)."""
        return 0 if self._cache is None else self._cache.nbytes()

    def _reusable(self, prompt: list[int], slot: int) -> int:
        """How many leading ids of `prompt` the slot holds keys and values for (at least one prompt token
        is left to run, for the next-token logits)."""
        held = self._held.get(slot) if self.reuse_prefix else None
        if not held:
            return 0
        n, limit = 0, min(len(held), len(prompt) - 1)
        while n < limit and held[n] == prompt[n]:
            n += 1
        return n

    def _prefill(self, prompts: list[list[int]], slots: list[int]):
        """Run what each row's slot does not hold yet (steps 1-3 of `_decode`); returns [rows, vocab]
        next-token logits (float32)."""
        reused = [self._reusable(p, slot) for p, slot in zip(prompts, slots, strict=True)]
        new = [i for i, n in enumerate(reused) if n == 0]
        if self.reuse_prefix and len(new) >= 2:  # 2. the new rows' common start, once
            shared = _common_prefix([prompts[i] for i in new])
            if shared >= 2:
                first = slots[new[0]]
                self._cache.forward(self.model, [prompts[new[0]][:shared]], [first], [0], logits=False,
                                    device=self.device)
                self._cache.copy_positions(first, [slots[i] for i in new[1:]], 0, shared)
                self.stats["prefill_tokens"] += shared
                for i in new:
                    reused[i] = shared
        # 3. one representative per (prompt, reused part)
        first_of: dict = {}
        rep = [first_of.setdefault((tuple(p), n) if self.reuse_prefix else i, i)
               for i, (p, n) in enumerate(zip(prompts, reused, strict=True))]
        runs = sorted(set(rep))
        fresh = [prompts[i][reused[i]:] for i in runs]
        logits = self._cache.forward(self.model, fresh, [slots[i] for i in runs], [reused[i] for i in runs],
                                     device=self.device).float()
        self.stats["prefill_tokens"] += sum(len(f) for f in fresh)
        for i, r in enumerate(rep):
            if r != i:
                self._cache.copy_positions(slots[r], [slots[i]], reused[i], len(prompts[i]))
        return logits[torch.tensor([runs.index(r) for r in rep], device=self.device)]

    # -- bookkeeping ------------------------------------------------------------------------

    @staticmethod
    def _zero_stats() -> dict[str, float]:
        return {"calls": 0, "prompts": 0, "prompt_tokens": 0, "prefill_tokens": 0, "decode_rows": 0,
                "guessed_tokens": 0, "accepted_guesses": 0, "new_tokens": 0, "capped_turns": 0, "closed_turns": 0,
                "seconds": 0.0}

    def pop_stats(self) -> dict[str, float]:
        """The counters since the last call, reset to zero."""
        stats, self.stats = self.stats, self._zero_stats()
        return stats

    def state_dict(self) -> dict[str, Any]:
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.generator.set_state(state["generator"])


def _common_prefix(sequences: list[list[int]]) -> int:
    """The length of the longest common prefix of `sequences`, leaving each at least one id after it."""
    limit = min(len(s) for s in sequences) - 1
    first = sequences[0]
    n = 0
    while n < limit and all(s[n] == first[n] for s in sequences):
        n += 1
    return n


class _Lookup:
    """A row's context and turn so far, indexed by its bigrams and trigrams: the guess after the row's last
    tokens is what followed their latest earlier occurrence (prompt lookup)."""

    def __init__(self, ids: list[int]) -> None:
        self.ids = list(ids)
        self.after: dict[tuple[int, ...], int] = {}
        for end in range(1, len(self.ids)):
            self._index(end)

    def _index(self, end: int) -> None:  # the n-grams that end just before `end`, which ids[end] follows
        for n in (2, 3):
            if end >= n:
                self.after[tuple(self.ids[end - n : end])] = end

    def append(self, token: int) -> None:
        self.ids.append(token)
        self._index(len(self.ids) - 1)

    def guess(self, k: int, stop: set[int]) -> list[int]:
        for n in (3, 2):
            at = self.after.get(tuple(self.ids[-n:])) if len(self.ids) > n else None
            if at is not None:
                out = []
                for token in self.ids[at : at + k]:
                    if token in stop:
                        break
                    out.append(token)
                return out
        return []


class _Turn:
    """The turn a batch of rows is writing: what each row drew, when it stops, and the draws.

    A draw is the one-token loop's: at temperature T > 0 the k-th token of row i is
    argmax(softmax(logits / T) / E[k][i]), E[k] a [rows, vocab] block of Exp(1) draws from the agent's
    generator (what `torch.multinomial(probs, 1)` computes), the k-th block for the k-th token of every
    row; at T = 0 it is argmax(logits). Blocks are drawn in order as rows reach them, and when the turn
    ends the generator is left as the one-token loop leaves it (after the block of the longest row's last
    token), so a guess changes neither the ids nor the draws of later turns: only how many forwards
    compute them.
    """

    def __init__(self, agent: HFPolicyAgent, prompts: list[list[int]], limits: list[int],
                 closers: list[tuple[str, ...]]) -> None:
        self.agent, self.limits, self.closers = agent, limits, closers
        self.stop = set(agent.stop_ids)
        rows = len(prompts)
        self.ids: list[list[int]] = [[] for _ in range(rows)]
        self.logps: list[list[float]] = [[] for _ in range(rows)]
        self.finish = ["length"] * rows
        self.tails = [""] * rows  # the end of each row's text, to spot a closing tag
        self.position = [len(p) for p in prompts]  # positions the row's slot holds
        self.lookups = [_Lookup(p) for p in prompts] if agent.draft_tokens else None
        self.blocks: dict[int, Any] = {}
        self.states: list[Any] = []  # the generator's state after each block

    def draw(self, fed: dict) -> dict[int, tuple[list[int], list[float]]]:
        """Per row, the token drawn after each of its fed positions (as if they all held) and its log-prob."""
        rows = list(fed)
        logits = torch.cat([fed[i][0] for i in rows])
        if self.agent.temperature == 0:
            logp = torch.log_softmax(logits, dim=-1)
            token = logits.argmax(dim=-1)
        else:
            logp = torch.log_softmax(logits / self.agent.temperature, dim=-1)
            index = [(len(self.ids[i]) + j, i) for i in rows for j in range(fed[i][0].shape[0])]
            noise = torch.stack([self._block(k, logits.shape[-1])[i] for k, i in index])
            token = (logp.exp() / noise).argmax(dim=-1)
        picked = logp.gather(-1, token[:, None]).squeeze(-1)
        tokens, logps = token.tolist(), picked.tolist()
        out, at = {}, 0
        for i in rows:
            n = fed[i][0].shape[0]
            out[i] = (tokens[at : at + n], logps[at : at + n])
            at += n
        return out

    def _block(self, k: int, vocab: int):
        while len(self.states) <= k:  # the one-token loop's draw for its step len(self.states)
            block = torch.empty((len(self.ids), vocab), dtype=torch.float32, device=self.agent.device)
            self.blocks[len(self.states)] = block.exponential_(1, generator=self.agent.generator)
            self.states.append(self.agent.generator.get_state())
        return self.blocks[k]

    def accept(self, i: int, tokens: list[int], logps: list[float], guesses: list[int]) -> int | None:
        """Take row i's draws in order while each follows a position that held (the guess before it was
        drawn); returns the last draw (to feed next), or None when the row ended."""
        for j, (token, lp) in enumerate(zip(tokens, logps, strict=True)):
            if self._record(i, token, lp):
                return None
            if j < len(guesses) and token == guesses[j]:
                self.position[i] += 1  # the guess at this position held: its keys and values stay
                self.agent.stats["accepted_guesses"] += 1
                continue
            return token
        raise AssertionError("a row's draws ended on a guess")  # the last position has no guess after it

    def _record(self, i: int, token: int, lp: float) -> bool:
        """Append a drawn token to row i; True when it ends the turn."""
        self.ids[i].append(token)
        self.logps[i].append(lp)
        if self.lookups is not None:
            self.lookups[i].append(token)
        if token in self.stop:
            self.finish[i] = "stop"
            return True
        if self.closers[i]:
            self.tails[i] = (self.tails[i] + self.agent.tokenizer.decode([token], skip_special_tokens=False))[-64:]
            if any(c in self.tails[i] for c in self.closers[i]):
                self.finish[i] = "action"
                return True
        return len(self.ids[i]) >= self.limits[i]

    def guess(self, i: int) -> list[int]:
        """Up to `draft_tokens` guessed tokens after row i's last draw, within its cap."""
        room = min(self.agent.draft_tokens, self.limits[i] - len(self.ids[i]) - 1)
        return self.lookups[i].guess(room, self.stop) if self.lookups is not None and room > 0 else []

    def result(self) -> list[tuple[list[int], list[float], str]]:
        longest = max(len(ids) for ids in self.ids)
        if self.states and longest:
            self.agent.generator.set_state(self.states[longest - 1])
        return [(ids, lps, finish) for ids, lps, finish in zip(self.ids, self.logps, self.finish, strict=True)]
