"""Play one registered env as an OpenRLHF multi-turn rollout (the agent executor's body).

`EnvEpisodeRunner.run` has the signature of OpenRLHF's `AgentExecutorBase.execute` and returns the
dict OpenRLHF's samples generator reads, plus our own entry `"agentgym"` with what the credit core
needs and OpenRLHF would drop:

- `turn_ids`: one per token of `observation_tokens`: k for the tokens the model generated in turn k,
  -1 for every other token (prompt, chat framing, observations). Written explicitly while the
  sequence is built, never inferred from runs of the action mask (those merge when an observation
  tokenizes to nothing and break on truncation).
- `action_spans`: per turn, the `[start, end)` token range of the action block the env parsed
  (`<action>...</action>` with its tags), or None for a turn without a valid action.
- `record`: the episode as an `agentgym_opsd.Episode` dict (responses, observations, step info,
  hindsight), the outcome reward and its parts.

The sequence is the full chat (the `full` context policy): the prompt of turn 0, then for each turn
the generated ids exactly as the model produced them, then the chat-wrapped observation. The env
reads the decoded turn; nothing is re-tokenized.

This module does not import OpenRLHF: `trainer/openrlhf/agent_func.py` wraps it in the
`AgentExecutor` class OpenRLHF loads.
"""

from __future__ import annotations

import asyncio
import copy
import threading
import uuid
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import gymnasium as gym
import torch

import agentgym_opsd
from agentgym_opsd.context import ContextPolicy
from agentgym_opsd.contract import Hindsight, StepInfo
from agentgym_opsd.episode import Episode, Turn
from trainer.chat import ChatFraming, framing_for, token_range
from trainer.credit import outcome_reward
from trainer.openrlhf.config import BridgeConfig, TaskLabel

__all__ = ["EnvEpisodeRunner", "PromptTooLong"]

AGENT_NAME = "openrlhf-policy"


class PromptTooLong(ValueError):
    """A task's first prompt leaves no room to generate within `--data.max_len`."""


class _EnvPool:
    """Idle envs per (env id, keyword arguments), reused across episodes of one process."""

    def __init__(self) -> None:
        self._idle: dict[str, list[gym.Env]] = defaultdict(list)
        self._lock = threading.Lock()

    @staticmethod
    def key(env_id: str, kwargs: dict[str, Any]) -> str:
        import json

        return env_id + "|" + json.dumps(kwargs, sort_keys=True, default=str)

    def acquire(self, env_id: str, kwargs: dict[str, Any]) -> gym.Env:
        with self._lock:
            idle = self._idle[self.key(env_id, kwargs)]
            if idle:
                return idle.pop()
        return agentgym_opsd.make(env_id, **kwargs)

    def release(self, env_id: str, kwargs: dict[str, Any], env: gym.Env) -> None:
        with self._lock:
            self._idle[self.key(env_id, kwargs)].append(env)

    def close(self) -> None:
        with self._lock:
            for envs in self._idle.values():
                for env in envs:
                    env.close()
            self._idle.clear()


class EnvEpisodeRunner:
    """Plays episodes of registered envs with an async token-level generator (a vLLM engine).

    Args:
        config: the bridge config (its `rollout` section, and its `credit` section for the outcome
            reward).
    """

    def __init__(self, config: BridgeConfig | None = None) -> None:
        self.config = config or BridgeConfig()
        self.settings = self.config.rollout
        self.pool = _EnvPool()
        self._threads = ThreadPoolExecutor(max_workers=int(self.settings.env_threads),
                                           thread_name_prefix="agentgym-env")

    def framing(self, tokenizer: Any) -> ChatFraming:
        """The policy's chat framing. OpenRLHF hands every call a freshly unpickled tokenizer: the
        template is read once per distinct chat template and no tokenizer is kept (`framing_for`)."""
        return framing_for(tokenizer, **self.settings.chat_template_kwargs)

    async def _env_call(self, fn, *args, **kwargs):
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._threads, lambda: fn(*args, **kwargs))

    async def run(
        self,
        prompt: str,
        label: Any,
        sampling_params: Any,
        max_length: int,
        hf_tokenizer: Any,
        llm_engine: Any,
        images: Any = None,
    ) -> dict[str, Any]:
        """Play one episode; see the module docstring for what comes back.

        Args:
            prompt: the dataset's prompt text (kept for OpenRLHF's logs; the chat is rebuilt from
                the env's reset so the tokens always match the task that is played).
            label: the row's `TaskLabel` (JSON string).
            sampling_params: vLLM `SamplingParams`; copied per turn with `max_tokens` set.
            max_length: the token budget of the whole sequence (`--data.max_len`).
            hf_tokenizer: the policy's tokenizer.
            llm_engine: has `async generate(prompt_token_ids, sampling_params)` returning a
                vLLM `RequestOutput`.
        """
        task = TaskLabel.parse(label)  # a malformed label or an unknown env id is a data set error: it raises
        agentgym_opsd.registry.entry(task.env_id)
        env_kwargs = {**self.settings.env_kwargs, **task.env_kwargs}
        if self.settings.max_turns is not None:
            env_kwargs.setdefault("max_turns", int(self.settings.max_turns))
        framing = self.framing(hf_tokenizer)
        try:
            env = await self._env_call(self.pool.acquire, task.env_id, env_kwargs)
        except Exception as e:  # noqa: BLE001 - one bad episode never ends the run
            return self._errored(task, prompt, framing, sampling_params, e)
        healthy = True
        try:
            return await self._play(env, task, env_kwargs, prompt, sampling_params, int(max_length), framing,
                                    llm_engine)
        except Exception as e:  # noqa: BLE001 - env failure, retrieval server down, prompt too long
            healthy = False
            return self._errored(task, prompt, framing, sampling_params, e)
        finally:
            if healthy:
                self.pool.release(task.env_id, env_kwargs, env)
            else:  # an env that failed mid-episode is not reused
                await self._env_call(_close_quietly, env)

    async def _play(self, env, task, env_kwargs, prompt, sampling_params, max_length, framing, llm_engine):
        raw = env.unwrapped
        options = dict(task.options)
        observation, info = await self._env_call(env.reset, seed=task.seed, options=options)
        initial: StepInfo = info["step"]
        policy = ContextPolicy.parse("full")
        messages = policy.messages(raw.instructions, observation, [])
        tokens = framing.prompt_ids(messages)
        per_turn_cap = self.settings.turn_max_tokens or getattr(sampling_params, "max_tokens", None)
        if len(tokens) >= max_length:
            raise PromptTooLong(
                f"{task.env_id} seed {task.seed}: the first prompt is {len(tokens)} tokens, --data.max_len is "
                f"{max_length}; raise --data.max_len"
            )
        turn_ids = [-1] * len(tokens)
        want_logprobs = getattr(sampling_params, "logprobs", None) is not None
        rollout_log_probs: list[float] | None = [0.0] * len(tokens) if want_logprobs else None
        action_ranges: list[tuple[int, int]] = []
        action_spans: list[list[int] | None] = []
        episode = Episode(
            env_id=task.env_id,
            task_id=initial.task_id,
            task_type=initial.task_type,
            episode_id=initial.episode_id,
            seed=task.seed,
            agent=AGENT_NAME,
            context=str(policy),
            instructions=raw.instructions,
            initial_observation=observation,
            initial=initial,
            group=f"{task.env_id}#{task.seed}",
            meta={"options": options, "env_kwargs": env_kwargs},
        )
        finish_reason = None
        context_full = False
        done = False
        while not done:
            budget = max_length - len(tokens)
            if budget < 1:
                context_full = True
                break
            params = copy.deepcopy(sampling_params)
            params.max_tokens = int(min(budget, per_turn_cap)) if per_turn_cap else int(budget)
            output = (await llm_engine.generate(tokens, params)).outputs[0]
            generated = [int(t) for t in output.token_ids]
            finish_reason = getattr(output, "finish_reason", None)
            text, offsets, closed = framing.split_response(generated)
            if not closed:  # cut at the token cap: it never generated its end-of-turn token
                finish_reason = "length"
            observation, reward, terminated, truncated, info = await self._env_call(env.step, text)
            step: StepInfo = info.pop("step")
            hindsight: Hindsight | None = info.pop("hindsight", None)
            k = len(episode.turns)
            start = len(tokens)
            tokens += generated
            turn_ids += [k] * len(generated)
            action_ranges.append((start, len(tokens)))
            local = token_range(offsets, step.action_span)
            action_spans.append(None if local is None else [start + local[0], start + local[1]])
            if rollout_log_probs is not None:
                rollout_log_probs += _sampled_log_probs(output, generated)
            turn_info = _jsonable(info)
            turn_info["finish_reason"] = finish_reason  # "length": no end-of-turn token (trainer.rows reads it)
            episode.turns.append(
                Turn(text, step.action, observation, float(reward), bool(terminated), bool(truncated), step, turn_info)
            )
            done = bool(terminated or truncated)
            if done:
                episode.hindsight = hindsight if hindsight is not None else raw.hindsight()
                break
            feedback = framing.feedback_ids(observation, closed)
            if len(tokens) + len(feedback) >= max_length:
                # No room for the next observation and a turn: the episode ends here, unfinished.
                context_full = True
                break
            tokens += feedback
            turn_ids += [-1] * len(feedback)
            if rollout_log_probs is not None:
                rollout_log_probs += [0.0] * len(feedback)
        if episode.hindsight is None:
            episode.hindsight = await self._env_call(raw.hindsight)
            if context_full:
                episode.meta["cut"] = "context full: the episode did not fit in --data.max_len"
        return self._response(task, prompt, episode, tokens, turn_ids, action_ranges, action_spans,
                              rollout_log_probs, finish_reason == "length", context_full)

    def _errored(self, task: TaskLabel, prompt: str, framing: ChatFraming, sampling_params: Any,
                 error: BaseException) -> dict[str, Any]:
        """An episode that failed (its env raised, the retrieval server was down, its prompt did not
        fit) as a sample OpenRLHF can carry: reward 0, a record with the error, and one placeholder
        token that OpenRLHF's action mask needs but the credit core gives no turn, hence advantage 0
        (`trainer.openrlhf.credit_rows` also puts it in a group of its own). Counted in
        `env/errored` and `credit/errored_episodes`; a batch where every episode errored stops the run."""
        reason = f"{type(error).__name__}: {error}"
        stop = framing.close_id if framing.close_id is not None else getattr(framing.tokenizer, "eos_token_id", None)
        stop = int(stop if stop is not None else 0)
        episode = Episode(
            env_id=task.env_id, task_id="", task_type="",
            episode_id=f"errored-{task.env_id}#{task.seed}-{uuid.uuid4().hex[:8]}",
            seed=task.seed, agent=AGENT_NAME, context="full", instructions="", initial_observation="", initial=None,
            group=f"{task.env_id}#{task.seed}", error=reason,
        )
        record = {
            "episode": episode.to_dict(), "success": False, "score": 0.0, "env_return": 0.0, "invalid_turns": 0,
            "num_turns": 0, "context_full": False, "reward": 0.0, "errored": True,
        }
        return {
            "prompt": prompt, "label": task.to_json(), "images": None, "mm_train_inputs": None,
            "reward": 0.0, "scores": 0.0,
            "observation_tokens": [stop, stop],
            "action_ranges": [(1, 2)],
            "rollout_log_probs": [0.0, 0.0] if getattr(sampling_params, "logprobs", None) is not None else None,
            "truncated": False,
            "extra_logs": {"env/success": 0.0, "env/score": 0.0, "env/return": 0.0, "env/turns": 0.0,
                           "env/invalid_turns": 0.0, "env/context_full": 0.0, "env/errored": 1.0},
            "agentgym": {"turn_ids": [-1, -1], "action_spans": [None], "record": record, "placeholder": [1]},
        }

    def _response(self, task, prompt, episode, tokens, turn_ids, action_ranges, action_spans,
                  rollout_log_probs, length_cut, context_full) -> dict[str, Any]:
        success = episode.success
        invalid = episode.invalid_turns
        credit = self.config.credit_config(task.env_id)
        # docs/credit.md#outcome-reward: the outcome reward R_i, with the credit config's coefficients, so
        # OpenRLHF's group normalisation of it is the credit core's GRPO advantage.
        reward = float(
            outcome_reward(
                torch.tensor([bool(success)]), torch.tensor([episode.score]), torch.tensor([invalid]),
                success_scale=credit.success_scale, score_coef=credit.score_coef, invalid_coef=credit.invalid_coef,
            )[0]
        )
        record = {
            "episode": episode.to_dict(),
            "success": bool(success),
            "score": float(episode.score),
            "env_return": episode.total_reward,
            "invalid_turns": int(invalid),
            "num_turns": episode.num_turns,
            "context_full": bool(context_full),
            "reward": float(reward),
            "errored": False,
        }
        return {
            "prompt": prompt,
            "label": task.to_json(),
            "images": None,
            "mm_train_inputs": None,
            "reward": float(reward),
            "scores": float(success),
            "observation_tokens": tokens,
            "action_ranges": action_ranges,
            "rollout_log_probs": rollout_log_probs,
            "truncated": bool(length_cut or context_full),
            "extra_logs": {
                "env/success": float(success),
                "env/score": float(episode.score),
                "env/return": episode.total_reward,
                "env/turns": float(episode.num_turns),
                "env/invalid_turns": float(invalid),
                "env/context_full": float(context_full),
                "env/errored": 0.0,
            },
            "agentgym": {"turn_ids": turn_ids, "action_spans": action_spans, "record": record},
        }

    def close(self) -> None:
        self.pool.close()
        self._threads.shutdown(wait=False)


def _close_quietly(env) -> None:
    try:
        env.close()
    except Exception:  # noqa: BLE001 - it already failed once
        pass


def _sampled_log_probs(output: Any, generated: list[int]) -> list[float]:
    """The rollout log-prob of each generated token (vLLM: one dict of top log-probs per token)."""
    per_token = getattr(output, "logprobs", None) or []
    out = []
    for i, token in enumerate(generated):
        entry = per_token[i].get(token) if i < len(per_token) and per_token[i] is not None else None
        out.append(float(entry.logprob) if entry is not None else 0.0)
    return out


def _jsonable(info: dict[str, Any]) -> dict[str, Any]:
    import json

    out = {}
    for k, v in info.items():
        try:
            json.dumps(v)
            out[k] = v
        except (TypeError, ValueError):
            out[k] = repr(v)
    return out
