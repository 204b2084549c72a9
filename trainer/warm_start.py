"""The supervised warm start: expert episodes with random detours, and what of them is imitated.

`PerturbedExpert` plays the env's expert with random detours (DART-style) and remembers, for each
detour, the turn the expert would have written there (its correction); `sft_targets` marks the
tokens to imitate (the expert's own turns, never a detour); `sft` runs the warm start of a local
run and returns its metrics (`sft_epoch`: one pass of token-mean cross-entropy).

A literate warm start (`TrainConfig.sft_privileged`): the OPSD methods' teacher is the policy itself
reading privileged text, which a model warm-started on plain expert turns has never seen; there, the
text acts as noise that lowers confident tokens (the teacher's evidence then points the wrong way).
`privileged_examples` also teaches the model the contexts its teacher will read, on a share of the
warm-start episodes, both outcomes included:
- hindsight (StepOPSD, RLSD): for each turn, the student's prefix up to the action, the hindsight
  block (`final_correctness: correct | incorrect`, the env's reference: the expert plan), then the
  action the expert takes in that state: the turn's own action, or after a detour its correction.
  An episode's turns go in one packed example (`SFTExample`): the conversation once, then each
  turn's block and target attending to the conversation before that turn (the teacher's `packed`
  layout), the same loss as one sequence per turn for far fewer tokens;
- skills (AgentOPSD): the conversation with the skill note before it, the expert's own turns as
  targets.
The policy the agent runs never reads privileged text (rollout prompts are never built from it).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from agentgym_opsd.agents import ExpertAgent
from agentgym_opsd.episode import Episode, save_episodes
from agentgym_opsd.parsing import parse_action
from agentgym_opsd.rollout import EpisodeRequest, run_episodes
from trainer.config import TrainConfig, TrainError
from trainer.env_knowledge import credit_config
from trainer.forward import block_causal_mask, token_logprobs
from trainer.loss import micro_batches
from trainer.optim import make_optimizer
from trainer.rows import build_rows
from trainer.run_state import compute_context, policy_rows
from trainer.teacher import agentopsd_sequences, stepopsd_inserts

__all__ = [
    "PerturbedExpert",
    "SFTExample",
    "expert_episodes",
    "privileged_examples",
    "privileged_sft_examples",
    "sft",
    "sft_epoch",
    "sft_targets",
]

class PerturbedExpert:
    """The env's expert with random detours (DART-style state perturbation).

    With probability `noise` a turn is a random admissible action instead of the expert's; the expert
    replans from wherever that leads. The detours put the expert in states it would never visit by
    itself (a wrong receptacle, an object not found yet), so a policy fine-tuned on the expert's
    turns also learns how to recover. `detours` holds `(episode_id, turn)` of the random turns
    (SFT leaves them out). Draws depend on (seed, episode id, turn) only, not on batching.

    An env that lists no admissible actions (Search-QA: any query is valid) gets no detours, unless
    `free_form_detours`: then a detour is the env's own `random_action` written in its format (on
    Search-QA a search of a few random words of the question and the last passages, a guess on the
    last turn).
    """

    def __init__(self, noise: float = 0.0, seed: int = 0, *, free_form_detours: bool = False) -> None:
        self.name = "expert"
        self.noise = float(noise)
        self.seed = int(seed)
        self.free_form_detours = bool(free_form_detours)
        self.expert = ExpertAgent()
        self.detours: set[tuple[str, int]] = set()
        self.corrections: dict[tuple[str, int], str] = {}  # detour -> the turn the expert would have written

    def act(self, messages, info, env) -> str:
        step = info.get("step")
        if step is not None and self.noise > 0 and (step.admissible_actions or self.free_form_detours):
            digest = hashlib.blake2b(step.episode_id.encode("utf-8", "surrogatepass"), digest_size=8).digest()
            rng = np.random.default_rng([self.seed, int.from_bytes(digest, "little"), int(step.turn)])
            if rng.random() < self.noise:
                self.detours.add((step.episode_id, int(step.turn)))
                self.corrections[(step.episode_id, int(step.turn))] = self.expert.act(messages, info, env)
                actions = step.admissible_actions
                if not actions:
                    return env.format_action(env.random_action(rng))
                return env.format_action(actions[int(rng.integers(len(actions)))])
        return self.expert.act(messages, info, env)


@dataclass
class SFTExample:
    """One warm-start sequence and the tokens it imitates.

    ids: [S] token ids. target: [S] bool, the tokens whose cross-entropy counts.
    Packed examples (the teacher's `packed` layout, `trainer.forward.TeacherSequence`) also have
    positions [S] (position ids), segment [S] (0: the conversation; k > 0: the k-th inserted block
    and target) and prefix [S] (a segment token also attends to conversation tokens at sequence
    positions < prefix); plain ones leave them None (one causal sequence).
    """

    ids: torch.Tensor
    target: torch.Tensor
    positions: torch.Tensor | None = None
    segment: torch.Tensor | None = None
    prefix: torch.Tensor | None = None

    @property
    def length(self) -> int:
        return int(self.ids.numel())

    @property
    def packed(self) -> bool:
        return self.segment is not None

    def unpacked(self) -> list[SFTExample]:
        """The plain sequences a packed example stands for: per segment, the conversation before it
        and the segment (the same targets and log-probs); a plain example is itself."""
        if not self.packed:
            return [self]
        out = []
        for k in self.segment.unique().tolist():
            if k == 0:
                continue
            where = (self.segment == k).nonzero().squeeze(1)
            head = self.ids[: int(self.prefix[where[0]])]
            ids = torch.cat([head, self.ids[where]])
            target = torch.cat([torch.zeros(head.numel(), dtype=torch.bool), self.target[where]])
            out.append(SFTExample(ids, target))
        return out


def packed_example(conversation: torch.Tensor, inserts: list[tuple[int, torch.Tensor, torch.Tensor]]) -> SFTExample:
    """A packed example: `conversation` (a row's ids, no targets) up to the last insertion point,
    then for each (s, block + target ids, target mask) a segment that reads the conversation before
    position s and sits at positions s, s + 1, ...."""
    end = max(s for s, _, _ in inserts)
    ids, target = [conversation[:end]], [torch.zeros(end, dtype=torch.bool)]
    positions = [torch.arange(end)]
    segment, prefix = [torch.zeros(end, dtype=torch.long)], [torch.zeros(end, dtype=torch.long)]
    for k, (s, seg_ids, seg_target) in enumerate(inserts, start=1):
        n = seg_ids.numel()
        ids.append(seg_ids)
        target.append(seg_target)
        positions.append(torch.arange(s, s + n))
        segment.append(torch.full((n,), k, dtype=torch.long))
        prefix.append(torch.full((n,), s, dtype=torch.long))
    return SFTExample(torch.cat(ids), torch.cat(target), torch.cat(positions), torch.cat(segment), torch.cat(prefix))


def sft_targets(rows, episodes, detours: set[tuple[str, int]]) -> tuple[torch.Tensor, int]:
    """[R, T] bool: the generated tokens of the expert's own turns (detour turns are left out), and
    the number of detour turns in the rows' episodes."""
    K = max([e.num_turns for e in episodes] + [1])
    detour = torch.zeros(len(episodes), K + 1, dtype=torch.bool)
    for i, e in enumerate(episodes):
        for k in range(e.num_turns):
            detour[i, k] = (e.episode_id, k) in detours
    is_detour = detour[rows.row_episode[:, None], rows.turn_id.clamp(min=0)]
    detour_turns = int(detour.sum())
    return rows.generated_mask() & ~is_detour, detour_turns


def privileged_examples(
    tokenizer,
    episodes,
    corrections: dict[tuple[str, int], str],
    *,
    hindsight_config=None,
    skills_config=None,
    max_length: int,
    chat_template_kwargs: dict | None = None,
    turns_per_episode: int = 2,
    seed: int = 0,
) -> list[SFTExample]:
    """Warm-start examples in the teacher's privileged contexts (module docstring).

    `episodes` are the warm-start episodes to teach them on (both outcomes), `corrections` the
    expert's turn at each detour; `hindsight_config` / `skills_config` the credit configs whose
    teacher contexts to build (None: not that one). An episode's hindsight example (packed) holds
    every detour turn (the corrections) and `turns_per_episode` of its other turns, drawn with
    `seed`; a turn whose conversation, block and target exceed `max_length` is left out.
    """

    out: list[SFTExample] = []
    kwargs = dict(chat_template_kwargs or {})
    if hindsight_config is not None and episodes:
        rows = build_rows(episodes, tokenizer, span_mode=hindsight_config.span_mode, chat_template_kwargs=kwargs)
        counters = {"truncated": 0, "truncated_tokens": 0, "peer_dropped": 0, "peer_cut": 0}
        close = tokenizer.convert_tokens_to_ids(rows.end_of_turn) if rows.end_of_turn else None
        draw = np.random.default_rng(seed)
        for r, inserts in stepopsd_inserts(tokenizer, episodes, rows, hindsight_config, max_length, counters).items():
            episode = episodes[int(rows.row_episode[r])]
            turns = [int(rows.turn_id[r, int(pos[0])]) for _, _, pos in inserts]
            own = [i for i, k in enumerate(turns) if (episode.episode_id, k) not in corrections]
            keep = {i for i, k in enumerate(turns) if (episode.episode_id, k) in corrections}
            keep |= {int(i) for i in draw.permutation(own)[:turns_per_episode]}
            segments = []
            for i, (s, block, pos) in enumerate(inserts):
                if i not in keep:
                    continue
                k = turns[i]
                correction = corrections.get((episode.episode_id, k))
                if correction is None:
                    target = rows.input_ids[r, pos]  # the expert's own action
                else:
                    parsed = parse_action(correction, ("action", "search", "answer"))
                    if hindsight_config.span_mode == "action_only" and parsed.span is not None:
                        text = correction[parsed.span[0] : parsed.span[1]]
                        target = torch.tensor(tokenizer(text, add_special_tokens=False)["input_ids"], dtype=torch.long)
                    else:
                        ids = tokenizer(correction, add_special_tokens=False)["input_ids"]
                        ids += [close] if close is not None else []
                        target = torch.tensor(ids, dtype=torch.long)
                if target.numel() == 0:
                    continue
                seg_ids = torch.cat([torch.tensor(block, dtype=torch.long), target])
                seg_target = torch.zeros(seg_ids.numel(), dtype=torch.bool)
                seg_target[-target.numel():] = True
                if s + seg_ids.numel() <= max_length:
                    segments.append((s, seg_ids, seg_target))
            if segments:
                out.append(packed_example(rows.input_ids[r], segments))
    if skills_config is not None and episodes:
        rows = build_rows(episodes, tokenizer, span_mode="clean_step", chat_template_kwargs=kwargs)
        own, _ = sft_targets(rows, episodes, set(corrections))
        counters = {"truncated": 0, "truncated_tokens": 0, "peer_dropped": 0, "peer_cut": 0}
        for seq in agentopsd_sequences(tokenizer, episodes, rows, skills_config, max_length, counters):
            keep = own[seq.row, seq.row_pos]
            if not bool(keep.any()):
                continue
            mask = torch.zeros(seq.length, dtype=torch.bool)
            mask[seq.target[keep]] = True
            out.append(SFTExample(seq.ids, mask))
    return out


def expert_episodes(config: TrainConfig, make_env, n: int, *, progress: str | bool = "expert episodes"
                    ) -> tuple[list[Episode], PerturbedExpert]:
    """`n` episodes of the (perturbed) expert on seeds sft_seed.., and the expert (its detours and
    their corrections)."""
    requests = [EpisodeRequest(seed=config.sft_seed + i, episode_id=f"expert-{i}") for i in range(n)]
    expert = PerturbedExpert(config.sft_noise, seed=config.seed)
    episodes = run_episodes(
        make_env, expert, requests, num_envs=min(16, max(1, n)), context=config.context, progress=progress,
    )
    return episodes, expert


def sft(config: TrainConfig, model, tokenizer, *, make_env: Callable[[], Any], out: Path,
        progress: bool = True) -> list[dict[str, Any]]:
    """The warm start of a local run: supervised fine-tuning of `model` (in place) on the env's expert,
    token-mean cross-entropy of the expert's own turns of its successful episodes (observations are
    context only), and with `sft_privileged` > 0 the teacher's privileged contexts too
    (`privileged_examples`). `make_env` makes the training env; the expert's episodes go to
    `out/episodes/sft_expert.jsonl`. The warm start has its own optimizer (`trainer.optim`, at `sft_lr`).

    Returns the metrics to log: one record per epoch (`kind` sft), then the summary (`kind` sft_done).
    """
    cfg = config
    started = time.perf_counter()
    played, expert = expert_episodes(cfg, make_env, cfg.sft_episodes, progress="expert episodes" if progress else False)
    episodes = [e for e in played if e.success and not e.error]
    if not episodes:
        raise TrainError(
            f"{cfg.env_id}: the expert solved none of {cfg.sft_episodes} episodes; nothing to warm-start on"
        )
    save_episodes(Path(out) / "episodes" / "sft_expert.jsonl", episodes)
    rows = policy_rows(cfg, model, tokenizer, episodes)
    target, detour_turns = sft_targets(rows, episodes, expert.detours)  # the expert's own turns only
    examples = [SFTExample(rows.input_ids[r, : int(rows.length[r])], target[r, : int(rows.length[r])])
                for r in range(rows.num_rows)]
    examples = [x for x in examples if bool(x.target.any())]
    generated_tokens = int(target.sum())
    limit = int(getattr(model.config, "max_position_embeddings", 32768) or 32768)
    privileged = privileged_sft_examples(cfg, tokenizer, [e for e in played if not e.error], expert.corrections,
                                         max_length=limit)
    examples += privileged
    optimizer = make_optimizer(model, lr=cfg.sft_lr, weight_decay=cfg.weight_decay)
    bar = tqdm(total=cfg.sft_epochs, desc="SFT warm start", unit="epoch", disable=not progress)
    loss_value = float("nan")
    sft_rng = np.random.default_rng(cfg.seed + 7)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    records: list[dict[str, Any]] = []
    for epoch in range(cfg.sft_epochs):
        with compute_context(cfg, model):
            loss_value = sft_epoch(model, optimizer, examples, sft_rng, pad_token_id=pad,
                                   batch_tokens=cfg.sft_batch_tokens, max_grad_norm=cfg.max_grad_norm)
        bar.update(1)
        bar.set_postfix(loss=f"{loss_value:.3f}")
        records.append({"kind": "sft", "step": 0, "sft/epoch": epoch + 1, "sft/loss": loss_value})
    bar.close()
    records.append({
        "kind": "sft_done", "step": 0, "sft/episodes": len(episodes), "sft/generated_tokens": generated_tokens,
        "sft/detour_turns": detour_turns, "sft/privileged_examples": len(privileged),
        "sft/loss": loss_value, "sft/seconds": time.perf_counter() - started,
    })
    return records


def privileged_sft_examples(config: TrainConfig, tokenizer, played: list[Episode], corrections: dict, *,
                            max_length: int) -> list[SFTExample]:
    """The literate warm start's examples (`privileged_examples`) on a share `sft_privileged` of the
    played expert episodes, both outcomes, in the contexts `sft_privileged_context` names."""
    if config.sft_privileged <= 0 or not played:
        return []

    pick = np.random.default_rng(config.seed + 11).random(len(played)) < config.sft_privileged
    chosen = [e for e, keep in zip(played, pick, strict=True) if keep]
    context_keys = {"hindsight_reference", "hindsight_peer", "peer_format", "peer_max_chars", "skills_dir",
                    "teacher_max_length"}
    shared = {k: v for k, v in config.credit.items() if k in context_keys}
    contexts = config.sft_privileged_context
    hindsight = credit_config(config.env_id, "stepopsd", **shared) if contexts in ("both", "hindsight") else None
    skills = credit_config(config.env_id, "agentopsd", **shared) if contexts in ("both", "skills") else None
    return privileged_examples(tokenizer, chosen, corrections, hindsight_config=hindsight, skills_config=skills,
                               max_length=max_length, chat_template_kwargs=config.chat_template_kwargs,
                               seed=config.seed + 13)


def sft_epoch(model, optimizer, examples: list[SFTExample], rng, *, pad_token_id: int, batch_tokens: int,
              max_grad_norm: float, share_prefix: bool = True) -> float:
    """One pass over the examples in shuffled micro-batches of about `batch_tokens` padded tokens
    (packed and plain ones in separate batches), one optimizer step each; returns the epoch's
    token-mean loss. `share_prefix=False` runs every plain row whole (the same loss and gradients
    up to float rounding; benchmarks/train_speed.py measures what the shared start saves)."""
    lengths = [x.length for x in examples]
    batches: list[list[SFTExample]] = []
    for packed in (False, True):
        idx = [i for i, x in enumerate(examples) if x.packed == packed]
        batches += [[examples[idx[j]] for j in batch]
                    for batch in micro_batches([lengths[i] for i in idx], batch_tokens)]
    total, count = 0.0, 0
    device = model.device
    for b in rng.permutation(len(batches)):
        chosen = batches[b]
        width = max(x.length for x in chosen)
        ids = torch.full((len(chosen), width), int(pad_token_id), dtype=torch.long)
        valid = torch.zeros((len(chosen), width), dtype=torch.bool)
        mask = torch.zeros((len(chosen), width), dtype=torch.bool)
        for j, x in enumerate(chosen):
            ids[j, : x.length], valid[j, : x.length], mask[j, : x.length] = x.ids, True, x.target
        positions = None
        if chosen[0].packed:  # the teacher's packed layout: a block-causal 4-D mask and position ids
            positions = torch.zeros((len(chosen), width), dtype=torch.long)
            segment = torch.full((len(chosen), width), -1, dtype=torch.long)
            prefix = torch.zeros((len(chosen), width), dtype=torch.long)
            for j, x in enumerate(chosen):
                positions[j, : x.length], segment[j, : x.length] = x.positions, x.segment
                prefix[j, : x.length] = x.prefix
            dtype = next(model.parameters()).dtype
            attention = block_causal_mask(segment.to(device), prefix.to(device), valid.to(device), dtype)
            positions = positions.to(device)
        else:
            attention = valid.to(torch.long).to(device)
        # Plain rows share their start (instructions, first observation): it runs once per batch.
        lp = token_logprobs(model, ids.to(device), attention, mask.to(device), position_ids=positions,
                            share_prefix=share_prefix and positions is None)
        n = mask.sum().clamp(min=1)
        loss = -(lp * mask.to(device)).sum() / n.to(device)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
        optimizer.step()
        total += loss.item() * int(n)
        count += int(n)
    return total / max(1, count)
