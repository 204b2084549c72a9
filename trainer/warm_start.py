"""The supervised warm start: expert episodes with random detours, and what of them is imitated.

`PerturbedExpert` plays the env's expert with random detours (DART-style) and remembers, for each
detour, the turn the expert would have written there (its correction); `sft_targets` marks the
tokens to imitate (the expert's own turns, never a detour); `LocalTrainer.sft` runs the epochs.

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
from dataclasses import dataclass

import numpy as np
import torch

from agentgym_opsd.agents import ExpertAgent

__all__ = ["PerturbedExpert", "SFTExample", "sft_targets", "privileged_examples", "PRIVILEGED_CONTEXTS"]

PRIVILEGED_CONTEXTS = ("both", "hindsight", "skills")


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
    Packed examples (the teacher's `packed` layout, `trainer.teacher.TeacherSequence`) also have
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
    positions, segment, prefix = [torch.arange(end)], [torch.zeros(end, dtype=torch.long)], [torch.zeros(end, dtype=torch.long)]
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
    return (rows.turn_id >= 0) & ~is_detour, detour_turns


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
    from agentgym_opsd.parsing import parse_action
    from trainer.rows import build_rows
    from trainer.teacher import agentopsd_sequences, stepopsd_inserts

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
                        ids = tokenizer(correction, add_special_tokens=False)["input_ids"] + ([close] if close is not None else [])
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
