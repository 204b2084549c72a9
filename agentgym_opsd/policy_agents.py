"""A local transformers policy as an agent (`hf:PATH`).

`HFPolicyAgent` samples the turns of all live episodes in one batched decoding loop: the chats are
rendered with the tokenizer's chat template, left-padded, and decoded together with a KV cache until
every row has written an end-of-turn token (or, with `stop_at_action_close`, its env's closing
action tag) or reached its per-turn token cap (its own, else the env's `max_turn_tokens`). Sampling draws from the
model's plain distribution (softmax of logits / temperature: no top-k, top-p or repetition penalty,
so the log-probs a trainer recomputes are those of the sampling policy) with the agent's own seeded
`torch.Generator`; temperature 0 is greedy.

torch and transformers are imported lazily: `import agentgym_opsd` stays light.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

from agentgym_opsd.agents import AgentError
from agentgym_opsd.context import Message
from agentgym_opsd.core import TextEnv

__all__ = [
    "DEFAULT_TURN_TOKENS",
    "HFPolicyAgent",
    "make_hf_agent",
    "load_hf_policy",
    "resolve_device",
    "resolve_dtype",
    "end_of_turn_ids",
    "pin_cpu_threads",
    "TINY_MODEL_PARAMETERS",
]

# The per-turn token cap for an env that does not name one (`TextEnv.max_turn_tokens`'s default).
DEFAULT_TURN_TOKENS = 256

# Below this many parameters a model's matrix products are so small that OpenMP synchronisation
# dominates a CPU forward pass: one torch thread is faster (the trainer pins one for the same reason).
TINY_MODEL_PARAMETERS = 50_000_000


def pin_cpu_threads(model, threads: int | None = None) -> int:
    """Set torch's CPU thread count for `model` when it runs on the CPU; returns the count in force.

    Args:
        threads: a count; 0 leaves torch's setting as it is; None (auto): 1 for a model under
            `TINY_MODEL_PARAMETERS` (the trainer's tiny models: on a busy 2-core machine one thread
            was 2-3x faster than torch's default), torch's setting otherwise.
    """
    import torch

    if threads is not None and int(threads) < 0:
        raise AgentError(f"cpu_threads must be >= 0, got {threads}")
    if next(model.parameters()).device.type != "cpu":
        return torch.get_num_threads()
    if threads is None:
        threads = 1 if sum(p.numel() for p in model.parameters()) < TINY_MODEL_PARAMETERS else 0
    if int(threads) > 0:
        torch.set_num_threads(int(threads))
    return torch.get_num_threads()


def resolve_device(name: str = "auto"):
    """`auto` is CUDA when a GPU is present, else CPU; `cpu`, `cuda`, `cuda:N` as given."""
    import torch

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise AgentError(f"device {name!r}: no CUDA GPU is visible here; use device cpu")
    return device


def resolve_dtype(name: str, device):
    """`auto` is bf16 on CUDA and float32 on CPU; `float32`, `bfloat16`, `float16` as given."""
    import torch

    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    table = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
             "float16": torch.float16, "fp16": torch.float16}
    if name not in table:
        raise AgentError(f"dtype {name!r}: use auto, float32, bfloat16 or float16")
    return table[name]


def end_of_turn_ids(tokenizer, model=None) -> list[int]:
    """The token ids that end an assistant turn: `<|im_end|>` (or another chat end-of-turn token)
    where the vocabulary has it, the tokenizer's eos, and the model's generation-config eos ids."""
    ids: list[int] = []
    vocab = tokenizer.get_vocab()
    for token in ("<|im_end|>", "<|eot_id|>", "<end_of_turn>"):
        if token in vocab:
            ids.append(int(vocab[token]))
    if tokenizer.eos_token_id is not None:
        ids.append(int(tokenizer.eos_token_id))
    if model is not None and getattr(model, "generation_config", None) is not None:
        eos = model.generation_config.eos_token_id
        ids.extend(int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos]) if e is not None)
    out = list(dict.fromkeys(ids))
    if not out:
        raise AgentError("the tokenizer has no end-of-turn token (no <|im_end|> and no eos_token)")
    return out


def load_hf_policy(path: str | Path, *, device: str = "auto", dtype: str = "auto"):
    """A local transformers causal LM and its tokenizer (which must have a chat template)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(path)
    if not (path / "config.json").is_file():
        raise AgentError(
            f"{path}: not a folder with a transformers model (no config.json); give a local model folder "
            "(a Qwen2.5/Qwen3 download, or a trainer run's OUT/model)"
        )
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    if not getattr(tokenizer, "chat_template", None):
        raise AgentError(f"the tokenizer in {path} has no chat template; the policy needs one to read chats")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    dev = resolve_device(device)
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=resolve_dtype(dtype, dev)).to(dev)
    model.eval()
    return model, tokenizer


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
        render: messages -> prompt text (default: the tokenizer's chat template with the generation
            prompt). A trainer passes the renderer its token rows use, so the policy samples from
            exactly the context that is scored.
        reuse_prefix: keep each episode's keys and values from one turn to the next and compute only
            the new part of its prompt (a full-chat prompt extends the previous one). Off for models
            whose caches are not plain (sliding windows).
        stop_at_action_close: also end a turn once it has written its env's closing action tag
            (`</action>`, `</search>`, `</answer>`: the env's `action_tags`), since a turn holds one
            action. Off by default: the trainer samples turns that end at the end-of-turn token.

    `stats` counts prompts, prompt and generated tokens, turns cut at the cap, turns ended at the
    action's closing tag and seconds spent.
    `samples[(episode_id, turn)]` holds, for every turn played through `act_batch`, the sampled token
    ids, their log-probs and the finish reason (`"stop"`: end-of-turn token or closing action tag
    written, `"length"`: cut at the cap); `annotate(episodes)` copies the reasons into `turn.info["finish_reason"]` and hands the
    ids and log-probs over. `state_dict()` / `load_state_dict()` save and restore the sampling
    generator (exact resume).
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
        render: Callable[[list[Message]], str] | None = None,
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
        self.max_batch = max_batch
        self.name = name
        self._render = render
        self.reuse_prefix = bool(reuse_prefix)
        self._prefixes: dict[str, tuple[list[int], list]] = {}
        self.samples: dict[tuple[str, int], tuple[list[int], list[float], str]] = {}
        self.stop_ids = end_of_turn_ids(tokenizer, model)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.stop_ids[0]
        self.device = next(model.parameters()).device
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(int(seed))
        self.stats = self._zero_stats()

    # -- the agent protocol -----------------------------------------------------------------

    def act(self, messages: list[Message], info: dict[str, Any], env: TextEnv) -> str:
        return self.act_batch([messages], [info], [env])[0]

    def act_batch(
        self, messages: Sequence[list[Message]], infos: Sequence[dict[str, Any]], envs: Sequence[TextEnv]
    ) -> list[str]:
        prompts = [self.prompt_ids(m) for m in messages]
        keys = [getattr(info.get("step"), "episode_id", None) for info in infos]
        limits = [self.turn_cap(env) for env in envs]
        closers = [self.closing_tags(env) for env in envs]
        # Episodes not in this tick have ended: their cached prefixes go.
        live = set(keys)
        for key in [k for k in self._prefixes if k not in live]:
            del self._prefixes[key]
        out: list[str] = []
        sampled: list[tuple[list[int], list[float], bool]] = []
        step = self.max_batch or len(prompts) or 1
        for start in range(0, len(prompts), step):
            window = slice(start, start + step)
            for ids, lps, cut in self._sample(prompts[window], keys[window], limits[window], closers[window]):
                out.append(self.tokenizer.decode(ids, skip_special_tokens=False))
                sampled.append((ids, lps, cut))
        for info, (ids, lps, cut) in zip(infos, sampled, strict=True):
            step_info = info.get("step")
            if step_info is not None:
                self.samples[(step_info.episode_id, int(step_info.turn))] = (ids, lps, "length" if cut else "stop")
        return out

    def annotate(self, episodes) -> dict[tuple[int, int], tuple[list[int], list[float]]]:
        """Write each turn's finish reason (`stop` or `length`) into `turn.info["finish_reason"]`;
        returns `{(episode index, turn): (sampled ids, log-probs)}` and forgets them."""
        out = {}
        for i, episode in enumerate(episodes):
            for k, turn in enumerate(episode.turns):
                record = self.samples.pop((episode.episode_id, k), None)
                if record is not None:
                    turn.info["finish_reason"] = record[2]
                    out[(i, k)] = (record[0], record[1])
        return out

    # -- pieces -----------------------------------------------------------------------------

    def turn_cap(self, env: Any = None) -> int:
        """The token cap of a turn in `env`: the agent's own, else the env's `max_turn_tokens`."""
        if self.max_new_tokens is not None:
            return self.max_new_tokens
        cap = getattr(env, "max_turn_tokens", None) if env is not None else None
        return int(cap) if isinstance(cap, int) and not isinstance(cap, bool) and cap > 0 else DEFAULT_TURN_TOKENS

    def closing_tags(self, env: Any = None) -> tuple[str, ...]:
        """The texts that end a turn in `env` besides the end-of-turn token (none unless
        `stop_at_action_close`)."""
        if not self.stop_at_action_close or env is None:
            return ()
        tags = getattr(env, "action_tags", None) or ()
        return tuple(f"</{tag}>" for tag in tags if isinstance(tag, str) and tag)

    def render(self, messages: list[Message]) -> str:
        """The prompt text of a chat: the chat template with the generation prompt."""
        if self._render is not None:
            return self._render(messages)
        return self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True, **self.chat_template_kwargs
        )

    def prompt_ids(self, messages: list[Message]) -> list[int]:
        return list(self.tokenizer(self.render(messages), add_special_tokens=False)["input_ids"])

    def sample(self, prompts: Sequence[Sequence[int]]) -> list[tuple[list[int], list[float]]]:
        """Decode one turn for each prompt (token ids): the generated ids, without the end-of-turn
        token, and their log-probs under the sampling distribution."""
        return [(ids, lps) for ids, lps, _ in self._sample(prompts)]

    def _sample(
        self,
        prompts: Sequence[Sequence[int]],
        keys: Sequence[str | None] | None = None,
        limits: Sequence[int] | None = None,
        closers: Sequence[tuple[str, ...]] | None = None,
    ) -> list[tuple[list[int], list[float], bool]]:
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
        self.stats["capped_turns"] += sum(1 for _, _, capped in result if capped)
        self.stats["seconds"] += time.perf_counter() - started
        return result

    def _decode(
        self, prompts: Sequence[Sequence[int]], keys: list[str | None], limits: list[int], closers: list[tuple[str, ...]]
    ) -> list[tuple[list[int], list[float], bool]]:
        """One batched decoding loop with a KV cache. Row i stops at an end-of-turn token, at a text
        of `closers[i]` (the token that completes it is kept), or after `limits[i]` tokens.

        Layout: row i is `[pad, reused prefix (n_i), pad, new prompt tokens, generated tokens]`, every
        row's next token in the same column. The reused prefix is the longest common prefix of the
        prompt with the ids this episode's cache holds from its previous turn (a full-chat prompt
        extends the previous prompt and response); its keys and values are not recomputed. Padding
        is masked out and positions are explicit, so a row's logits do not depend on the others.
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
            tokens.append(torch.where(done, torch.full_like(token, -1), token))
            logps.append(logp.gather(-1, token[:, None]).squeeze(-1))
            was_done = done
            done = done | torch.isin(token, stop)
            if watch:
                values, ended = token.tolist(), was_done.tolist()
                for i in watch:
                    if not ended[i] and values[i] not in self.stop_ids:
                        tails[i] = (tails[i] + self.tokenizer.decode([values[i]], skip_special_tokens=False))[-64:]
                        if any(c in tails[i] for c in closers[i]):
                            closed[i] = True
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
        result = []
        for i, (row, lps) in enumerate(zip(table, lp_table, strict=True)):
            ids: list[int] = []
            values: list[float] = []
            capped = not closed[i]
            for token, lp in zip(row, lps, strict=True):
                if token < 0:
                    break
                if token in self.stop_ids:
                    capped = False
                    self.stats["new_tokens"] += 1  # the end-of-turn token was generated too
                    break
                ids.append(int(token))
                values.append(float(lp))
            self.stats["new_tokens"] += len(ids)
            result.append((ids, values, capped))
        self.stats["closed_turns"] += sum(closed)
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
        import torch
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
            held = list(prompt) + ids  # the stop token (or the last capped token) was never fed
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


def make_hf_agent(spec: str, *, seed: int = 0) -> HFPolicyAgent:
    """`hf:PATH` or `hf:PATH?temperature=0.7&max_new_tokens=256&device=cuda&dtype=bf16&cpu_threads=4&stop=eot`.

    Options:
        temperature: sampling temperature (default 1; 0 is greedy).
        max_new_tokens: the per-turn token cap. Default: the model's own (`max_new_tokens` in its
            generation_config.json) where it sets one, else each env's `max_turn_tokens`.
        device, dtype: `auto` (default), `cpu`, `cuda:N`; `float32`, `bf16`, ...
        max_batch: at most this many prompts per decoding call.
        cpu_threads: torch CPU threads (`pin_cpu_threads`): a count, 0 to leave torch's setting,
            `auto` (default: 1 for a tiny model, torch's setting for others).
        stop: `action` (default): a turn also ends at its env's closing action tag (`</action>`);
            `eot`: only at the end-of-turn token or the cap, as the trainer's rollouts sample.
    """
    path, _, query = spec.partition("?")
    options = dict(parse_qsl(query, keep_blank_values=True))
    known = {"temperature", "max_new_tokens", "device", "dtype", "max_batch", "cpu_threads", "stop"}
    unknown = set(options) - known
    if unknown:
        raise AgentError(f"hf:{spec}: unknown option(s) {sorted(unknown)}; use {sorted(known)}")
    stop = options.get("stop", "action")
    if stop not in ("action", "eot"):
        raise AgentError(f"hf:{spec}: stop={stop!r}: use action (end a turn at the env's closing action tag) or eot")
    try:
        temperature = float(options.get("temperature", 1.0))
        max_new_tokens = int(options["max_new_tokens"]) if "max_new_tokens" in options else None
        max_batch = int(options["max_batch"]) if "max_batch" in options else None
        threads = options.get("cpu_threads", "auto")
        cpu_threads = None if threads == "auto" else int(threads)
    except ValueError as e:
        raise AgentError(f"hf:{spec}: bad option value ({e})") from None
    model, tokenizer = load_hf_policy(path, device=options.get("device", "auto"), dtype=options.get("dtype", "auto"))
    pin_cpu_threads(model, cpu_threads)
    if max_new_tokens is None:
        own = getattr(getattr(model, "generation_config", None), "max_new_tokens", None)
        max_new_tokens = int(own) if isinstance(own, int) and own > 0 else None
    return HFPolicyAgent(
        model, tokenizer, max_new_tokens=max_new_tokens, temperature=temperature, seed=seed, max_batch=max_batch,
        name=f"hf:{Path(path).name}", stop_at_action_close=stop == "action",
    )
