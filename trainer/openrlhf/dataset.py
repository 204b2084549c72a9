"""The prompt dataset OpenRLHF reads: one JSON line per task (env id, split and seed).

Each row holds
- `prompt`: the chat the policy reads before its first turn (the env's instructions as the system
  message, the first observation as the user message); train with `--data.input_key prompt
  --data.apply_chat_template`;
- `label`: the `TaskLabel` (env id, seed, reset options, env keyword arguments) as a JSON string;
  train with `--data.label_key label`. The agent executor resets the env from it;
- `datasource`: `Family/subset`, which OpenRLHF's evaluation uses to report pass@k per subset.

OpenRLHF samples `--rollout.n_samples_per_prompt` episodes per row: a GRPO group of one task.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from typing import Any

from tqdm.auto import tqdm

import agentgym_opsd
from agentgym_opsd.context import ContextPolicy
from agentgym_opsd.io import atomic_write_text
from agentgym_opsd.registry import entry
from trainer.openrlhf.config import TaskLabel

__all__ = ["prompt_rows", "write_prompt_dataset", "parse_seeds"]


def parse_seeds(text: str) -> list[int]:
    """`"0:512"` (a range, end excluded), `"3,5,9"`, or a mix: `"0:4,10"`."""
    seeds: list[int] = []
    for part in str(text).split(","):
        part = part.strip()
        if not part:
            continue
        try:
            if ":" in part:
                a, b = part.split(":", 1)
                lo, hi = int(a), int(b)
                if hi <= lo:
                    raise ValueError
                seeds.extend(range(lo, hi))
            else:
                seeds.append(int(part))
        except ValueError:
            raise ValueError(
                f"seeds {text!r}: write START:END (END excluded) or a comma list, e.g. 0:512 or 1,2,3") from None
    if not seeds:
        raise ValueError(f"seeds {text!r}: no seed given")
    return seeds


def prompt_rows(
    env_id: str,
    seeds: Iterable[int],
    env_kwargs: dict[str, Any] | None = None,
    reset_options: dict[str, Any] | None = None,
    progress: bool = True,
) -> list[dict[str, Any]]:
    """One dataset row per seed (each seed picks a task: `seed % num_tasks`)."""
    env_kwargs = dict(env_kwargs or {})
    options = dict(reset_options or {})
    spec = entry(env_id)
    env = agentgym_opsd.make(env_id, **env_kwargs)
    rows = []
    try:
        for seed in tqdm(list(seeds), desc=f"prompts {env_id}", unit="task", disable=not progress, leave=False):
            observation, info = env.reset(seed=int(seed), options=dict(options))
            raw = env.unwrapped
            step = info["step"]
            messages = ContextPolicy.parse("full").messages(raw.instructions, observation, [])
            label = TaskLabel(env_id, int(seed), options, env_kwargs)
            rows.append(
                {
                    "prompt": messages,
                    "label": label.to_json(),
                    "datasource": f"{spec.family}/{step.task_type or spec.subset}",
                    "task_id": step.task_id,
                }
            )
    finally:
        env.close()
    return rows


def write_prompt_dataset(
    path: str | os.PathLike[str],
    env_id: str,
    seeds: Iterable[int],
    env_kwargs: dict[str, Any] | None = None,
    reset_options: dict[str, Any] | None = None,
    progress: bool = True,
) -> int:
    """Write the rows of `prompt_rows` as JSONL, atomically. Returns the number of rows."""
    rows = prompt_rows(env_id, seeds, env_kwargs, reset_options, progress)
    atomic_write_text(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    return len(rows)
