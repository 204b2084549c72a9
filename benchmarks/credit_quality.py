"""Does per-turn credit land on the turns that mattered? Every method's credit against the env's oracle.

    .venv/bin/python -m benchmarks.credit_quality                          # the tiny Qwen3, warm-started (ALFWorld)
    .venv/bin/python -m benchmarks.credit_quality --warm-start plain
    .venv/bin/python -m benchmarks.credit_quality --model smollm2-135m     # the real model, no warm start
    .venv/bin/python -m benchmarks.credit_quality --model smollm2-135m --family all --quick
    .venv/bin/python -m benchmarks.credit_quality --page   # also writes docs/benchmarks/credit_quality.md

1. The model, student and live teacher at once (for a warm start, also the stale teacher a run starts
   from: the frozen warm start); `--teacher-model` scores the teacher's contexts with another model.
   `--model tiny` (the default): a tiny Qwen3 warm-started
   on ALFWorld Pick (cached under OUT/warmstart-<kind>-<N>games): fine-tuned on the expert with random
   detours, as the learning benchmark does, on `--train-games` Pick games (1,000 by default: on 200 a
   tiny model memorises the games, benchmarks/warm_start.py). `--warm-start plain` imitates the
   expert's turns only; `literate` also teaches the model the privileged contexts its teacher will read
   (the hindsight block, AgentOPSD's skill note) on a share of the episodes (`--literate-share`).
   `--model NAME_OR_FOLDER` (anything `trainer.policy.load_hf_policy` takes: `smollm2-135m`, a model
   folder) skips the warm start and uses that model as it is.
2. Episodes, per family (`--family alfworld|webshop|searchqa|all`, or `--env ID`): G per task of the
   env's expert with random detours (good and bad turns both plentiful), with the env's privileged
   turn labels on (`turn_labels=True`; ALFWorld: the expert's remaining plan got shorter; WebShop: a
   search that finds the target, opening it, choosing a goal option, buying it; Search-QA: a search
   whose passages hold the gold answer, or the right answer). Detours: a random admissible action
   (ALFWorld: a command; WebShop: a click on anything the page shows, or the page's example search),
   and on Search-QA, which lists no admissible actions, the env's own random action (a search of a few
   random words of the question and the passages, a guess on the last turn).
3. Log-probs, once per family and cached under OUT/cache/ (a rerun or a crash redoes no forward): the
   student's, and the teacher's in each privileged context: StepOPSD's hindsight block `full`
   (outcome, the peer trajectory for failed episodes of mixed groups, the env's reference: expert
   plan, target product, gold answer), `outcome only` (the block without peer and reference) and
   `placebo` (the same block with another task's reference and peer: each episode reads the reference
   of an episode of the next task with the same outcome, see `placebo_episodes`); AgentOPSD's skill
   note (the project's general note, then the family's note for the task type), a placebo family note
   (the general note, then another family's note of the closest length) and a placebo note (two other
   families' notes in place of both: no project text; see `placebo_note_text`). Each is scored over the
   whole response (`clean_step`);
   where the family scores only the action (`action_only`) and every action starts its response (no
   reasoning before it: the experts' turns), the action span's teacher context is the same, so its
   log-probs are read from that pass (otherwise it gets its own).
4. Every method's credit from those log-probs (`compute_advantages(..., return_parts=True)`, a live
   teacher, no lambda decay): GRPO, GiGPO, StepOPSD with each hindsight context (and with its budget
   off), AgentOPSD with each note, RLSD.
5. AUCs against the labels, with bootstrap 95% intervals that resample GAMES (the G episodes of a task
   share their group's normalisation, so they are not independent; with `--policy-episodes`, policy
   group t plays expert group t's game, reset seed 50,000 + t, and a game's expert and policy groups
   are one unit: `bootstrap_units`): every draw takes all episodes of the drawn games, and every cell
   of a table uses the same draws (differences are paired).
   - turn level, within episodes: does a turn's credit (the mean of A~ / |A| over its generated
     tokens) rank progress turns above the others, among pairs of turns of one episode? In successful
     episodes (credit should go to progress turns) and in failed ones (blame to the others). GRPO gives
     every turn of an episode the same credit: 0.5. StepOPSD's per-step budget makes every turn's mean
     |A~| equal by design (it moves credit among the tokens of a turn): it is judged at token level,
     and at turn level with the budget off.
   - token level (StepOPSD, RLSD): inside the action, the tokens that agree with the expert's action at
     that state against those that depart from it: does sign(A) (w_t - 1) give the agreeing ones more?
   - the raw signals: the evidence e_k (teacher minus student log-prob over the turn's scored span) and
     the gap delta_t per token, per context; the student's own log-prob (what the model already knows);
     and what is left of e_k beyond the least-squares part b * lp_S (`beyond lp_S`: the privileged text
     merely flattening the model's distribution lowers the tokens it is sure of and raises the others),
     the slope b refitted inside every bootstrap draw; r and b of the full sample are printed.
Prints one table per family and writes OUT/credit_quality-<model>-<family>.json and .txt.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import io
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

import agentgym_opsd
from agentgym_opsd.episode import load_episodes, save_episodes
from agentgym_opsd.io import atomic_write_bytes, atomic_write_json, atomic_write_text
from agentgym_opsd.registry import UnknownEnvError, entry
from agentgym_opsd.rollout import EpisodeRequest, run_episodes
from benchmarks.common import add_page_argument, benchmark_command, git_commit, markdown_table, write_results_page
from trainer.config import TrainConfig
from trainer.credit import compute_advantages
from trainer.credit_auc import (
    EpisodeItems,
    beyond_auc,
    interval,
    pooled_auc,
    resample_counts,
    side_items,
    within_auc,
)
from trainer.env_knowledge import SKILLS_DIR, credit_config, skill_text
from trainer.forward import row_logprobs
from trainer.local import LocalTrainer
from trainer.models import is_named_model, resolve_model
from trainer.policy import PolicyLoadError, load_hf_policy, load_policy
from trainer.recipes import PICK_ENV, PICK_TINY, TINY_QWEN3
from trainer.rows import build_rows
from trainer.sampling import HFPolicyAgent
from trainer.teacher import hindsight_block, peer_episodes, score_teacher
from trainer.warm_start import PerturbedExpert


@dataclasses.dataclass(frozen=True)
class FamilySpec:
    """How one env family is benchmarked: its env, options, turn cap, detour rate (the expert's random
    detours: chosen so that roughly half to two thirds of the episodes succeed), and the task types whose
    skill notes may serve as another family's placebo note."""

    name: str
    env: str
    options: dict[str, Any]
    max_turns: int
    detour: float
    free_form_detours: bool = False
    note_types: tuple[str, ...] = ()


FAMILIES: dict[str, FamilySpec] = {
    "alfworld": FamilySpec(
        "alfworld", PICK_ENV,
        {"room": "small", "split": "train", "panel_own_types": True, "progress": False},  # + panel_size (--train-games)
        max_turns=8, detour=0.5, note_types=("pick", "look", "clean", "heat", "cool", "pick_two"),
    ),
    "webshop": FamilySpec(
        "webshop", "agentgym/WebShop-v0", {"split": "train"}, max_turns=10, detour=0.5,
        note_types=("beauty", "electronics", "fashion", "garden", "grocery"),
    ),
    "searchqa": FamilySpec(
        "searchqa", "agentgym/SearchQA-Synthetic-v0", {"split": "train"}, max_turns=4, detour=0.7,
        free_form_detours=True, note_types=("single_hop", "multi_hop"),
    ),
}

COLUMNS = ("turn/success/within", "turn/failure/within", "token/success", "token/failure")
HINDSIGHT_CONTEXTS = {"full": "hindsight full", "outcome": "hindsight outcome only", "placebo": "hindsight placebo"}
NOTE_CONTEXTS = {"skills": "skill note", "skills-placebo": "placebo family note", "skills-placebo-all": "placebo note"}


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny",
                    help="`tiny` (a tiny Qwen3 warm-started on ALFWorld Pick, ALFWorld only), or a named model "
                    "(smollm2-135m) or model folder, used as it is as student and live teacher")
    ap.add_argument("--family", choices=(*FAMILIES, "all"), default=None, help="the env families (default alfworld)")
    ap.add_argument("--env", action="append", default=None, help="an env id instead of the family's (repeatable)")
    ap.add_argument("--tasks", type=int, default=32, help="tasks per family (x --group-size episodes)")
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--detour", type=float, default=None,
                    help="the expert's random-detour rate (default: the family's)")
    ap.add_argument("--max-turns", type=int, default=None,
                    help="default: the family's (ALFWorld 8, WebShop 10, Search-QA 4)")
    ap.add_argument("--teacher-model", help="score the teacher's contexts with this model (smollm2-135m or a model "
                    "folder with the student's tokenizer) instead of the student: e.g. the untrained instruct model "
                    "reading hindsight about a warm start's episodes")
    ap.add_argument("--policy-episodes", type=int, default=0,
                    help="also score the model's own rollouts (group t replays expert group t's game)")
    ap.add_argument("--warm-start", choices=("plain", "literate"), default="literate")
    ap.add_argument("--literate-share", type=float, default=0.5)
    ap.add_argument("--sft-episodes", type=int, default=400)
    ap.add_argument("--sft-epochs", type=int, default=5)
    ap.add_argument("--tiny-hidden", type=int, default=TINY_QWEN3["tiny_hidden"])
    ap.add_argument("--tiny-layers", type=int, default=TINY_QWEN3["tiny_layers"])
    ap.add_argument("--train-games", type=int, default=1000,
                    help="ALFWorld: a panel of that many Pick training games, the scored episodes' games (and the tiny "
                    "model's warm start's: benchmarks/warm_start.py: a tiny model memorises 200 games, not 1,000)")
    ap.add_argument("--bootstrap", type=int, default=1000, help="bootstrap draws (of games)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads (1: on a shared 2-core machine a second thread costs more than it gives)")
    ap.add_argument("--micro-batch-tokens", type=int, default=2048,
                    help="padded tokens per forward (on one CPU thread 2,048 ran 1.5-2.5x faster than 16,384)")
    ap.add_argument("--out", default="runs/credit_quality")
    add_page_argument(ap)
    ap.add_argument("--quick", action="store_true", help="8 tasks x 4 per family, 300 warm-start episodes, 300 draws")
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)
    for name in ("train_games", "tasks", "group_size", "bootstrap", "threads", "micro_batch_tokens"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.detour is not None and not 0 <= args.detour <= 1:
        ap.error(f"--detour is a probability, got {args.detour}")
    if args.max_turns is not None and args.max_turns < 1:
        ap.error(f"--max-turns must be >= 1, got {args.max_turns}")
    if args.family and args.env:
        ap.error("give --family or --env, not both")
    try:
        args.families = selected_families(args.family, args.env)
    except ValueError as e:
        ap.error(str(e))
    if args.model != "tiny":
        if not is_named_model(args.model) and not (Path(args.model) / "config.json").is_file():
            ap.error(
                f"--model {args.model}: not `tiny`, a named model (smollm2-135m) or a model folder (no config.json)")
    if args.model == "tiny" and any(spec.name != "alfworld" for spec in args.families):
        ap.error("--model tiny is warm-started on ALFWorld Pick only; give --model smollm2-135m (or a model folder) "
                 "for the other families")
    if args.quick:
        args.tasks, args.sft_episodes, args.bootstrap = 8, 300, 300
    return args


def selected_families(family: str | None, envs: Sequence[str] | None) -> list[FamilySpec]:
    """The families to run: `--family` (default alfworld), or one per `--env` id (the family's spec, that env)."""
    if not envs:
        names = list(FAMILIES) if family == "all" else [family or "alfworld"]
        return [FAMILIES[n] for n in names]

    out = []
    for env_id in envs:
        try:
            name = entry(env_id).family.lower().replace("-", "")
        except UnknownEnvError as e:
            raise ValueError(str(e)) from None
        if name not in FAMILIES:
            raise ValueError(f"{env_id}: family {name!r} has no benchmark settings; known: {', '.join(FAMILIES)}")
        out.append(dataclasses.replace(FAMILIES[name], env=env_id))
    return out


# ---------------------------------------------------------------------------------------------
# Privileged contexts: placebos


def placebo_episodes(episodes: Sequence[Any]) -> list[Any]:
    """Copies of `episodes` whose StepOPSD hindsight block reads another task's text of the same kind.

    Each episode's reference becomes that of an episode with the same outcome of the next task (groups in
    batch order, cyclically, skipping groups of the same task id; the k-th such episode of a group reads
    the k-th, modulo, of the donor's), so
    the placebo references are real ones with the same length distribution. The first successful episode
    of each group, whose actions the group's failed episodes read as their peer trajectory, carries the
    turns of the next task's first successful episode. Outcome and everything the rows are built from stay
    the episode's own (`trainer.teacher.hindsight_block` reads only the outcome, the reference and the
    peer's actions). An episode whose outcome no other task shares gets no reference."""
    order = list(dict.fromkeys(e.group_key for e in episodes))
    members: dict[str, list[int]] = {g: [] for g in order}
    for i, e in enumerate(episodes):
        members[e.group_key].append(i)

    def donors(group: str, success: bool) -> list[int]:
        at, task = order.index(group), episodes[members[group][0]].task_id
        for step in range(1, len(order)):
            other = order[(at + step) % len(order)]
            found = [i for i in members[other] if episodes[i].success == success and episodes[i].task_id != task]
            if found:
                return found
        return []

    out = []
    for i, e in enumerate(episodes):
        same = [j for j in members[e.group_key] if episodes[j].success == e.success]
        pool = donors(e.group_key, e.success)
        reference = episodes[pool[same.index(i) % len(pool)]].hindsight.reference if pool else ""
        copy = dataclasses.replace(e, hindsight=dataclasses.replace(e.hindsight, reference=reference))
        if e.success and same[0] == i:  # the group's peer
            winners = donors(e.group_key, True)
            copy = dataclasses.replace(copy, turns=list(episodes[winners[0]].turns) if winners else [])
        out.append(copy)
    return out


def note_file_name(task_type: str) -> str:
    """The file `trainer.env_knowledge.skill_text` reads for a task type in a `skills_dir`."""
    return str(task_type).strip().lower().replace("-", "_").replace(" ", "_") + ".txt"


def placebo_note_text(spec: FamilySpec, task_type: str | None, exclude: Sequence[str] = ()) -> tuple[str, str]:
    """Another family's skill note of the length closest to the family's own note for `task_type` (to the
    empty note where the family has none; to the general note for `task_type` None), other than the
    sources in `exclude`. Returns (the note, `family:task type` it comes from)."""
    if task_type is None:
        own_len = len((Path(SKILLS_DIR) / "general.txt").read_text(encoding="utf-8").strip())
    else:
        own = entry(spec.env).skill_notes
        own_len = len((own(task_type) if own else None) or "")
    pool = []
    for other in FAMILIES.values():
        if other.name == spec.name:
            continue
        notes = entry(other.env).skill_notes
        for kind in other.note_types:
            text = notes(kind) if notes else None
            if text and f"{other.name}:{kind}" not in exclude:
                pool.append((abs(len(text) - own_len), f"{other.name}:{kind}", text))
    if not pool:
        raise ValueError(f"no other family's skill note to use as {spec.name}'s placebo")
    _, source, text = min(pool)
    return text, source


def write_placebo_notes(folder: Path, spec: FamilySpec, task_types: Sequence[str], *, general: bool = False) -> dict:
    """A `skills_dir` (`CreditConfig.skills_dir`) whose note is a placebo: per task type, another family's
    note in place of the family's; with `general`, another one in place of the project's general note too
    (no project text left). Returns {task type or "general": the source of its note}."""
    sources = {}
    if general:
        text, sources["general"] = placebo_note_text(spec, None)
        atomic_write_text(folder / "general.txt", text + "\n")
    else:
        atomic_write_text(folder / "general.txt", (Path(SKILLS_DIR) / "general.txt").read_text(encoding="utf-8"))
    for kind in sorted(set(task_types)):
        text, sources[kind] = placebo_note_text(spec, kind, exclude=list(sources.values()))
        atomic_write_text(folder / note_file_name(kind), text + "\n")
    return sources


# ---------------------------------------------------------------------------------------------
# Cache


def _tensor_file_write(path: Path, payload: dict) -> None:
    import torch

    buffer = io.BytesIO()
    torch.save(payload, buffer)
    atomic_write_bytes(path, buffer.getvalue())


def rows_digest(rows) -> str:
    """A fingerprint of the rows a cached tensor belongs to (ids and scored span)."""
    h = hashlib.sha256()
    h.update(rows.input_ids.cpu().numpy().tobytes())
    h.update(rows.span.cpu().numpy().tobytes())
    return h.hexdigest()[:16]


def context_digest(episodes, config, rows_hash: str) -> str:
    """A fingerprint of what a teacher pass reads: the rows, and the privileged text each episode gets (the
    hindsight blocks with their peers, or the skill notes), so that a changed placebo is never read from the cache."""
    h = hashlib.sha256(rows_hash.encode())
    if config.method == "agentopsd":
        for e in episodes:
            h.update(skill_text(e.env_id, e.task_type, config.skills_dir).encode())
    else:
        peers = peer_episodes(episodes) if config.hindsight_peer else {}
        for i, e in enumerate(episodes):
            h.update(hindsight_block(e, episodes[peers[i]] if i in peers else None, config)[0].encode())
    h.update(f"{config.span_mode}|{config.peer_format}|{config.peer_max_chars}".encode())
    return h.hexdigest()[:16]


def cached_scores(path: Path, digest: str, compute: Callable[[], dict], log: Callable[[str], None],
                  commit: str) -> dict:
    """The tensors in `path` when they were computed for rows with `digest`, else `compute()` (saved atomically,
    with the run's commit, the date and the machine load)."""
    import torch

    if path.is_file():
        try:
            payload = torch.load(path, weights_only=True)
        except Exception as e:  # a torn or foreign file: recompute
            log(f"{path.name}: unreadable ({type(e).__name__}: {e}); recomputing")
        else:
            if payload.get("rows_digest") == digest:
                log(f"{path.name}: cached ({payload.get('seconds', 0):.0f}s when computed)")
                return payload
            log(f"{path.name}: computed for other rows; recomputing")
    started, load = time.perf_counter(), os.getloadavg()[0]
    payload = compute()
    payload.update(rows_digest=digest, seconds=time.perf_counter() - started, commit=commit,
                   load=[load, os.getloadavg()[0]], date=time.strftime("%Y-%m-%d %H:%M"))
    _tensor_file_write(path, payload)
    return payload


def model_fingerprint(path: Path) -> str:
    """The model folder and its weight files' sizes and times: a different model gets a different cache."""
    parts = [str(path.resolve())]
    for f in sorted(path.glob("*")):
        if f.suffix in (".safetensors", ".bin", ".json") and f.is_file():
            st = f.stat()
            parts.append(f"{f.name}:{st.st_size}:{int(st.st_mtime)}")
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:12]


# ---------------------------------------------------------------------------------------------
# The benchmark


def load_model(args, out: Path, progress: bool):
    """(model, tokenizer, label, folder, seconds): the tiny warm start (trained and cached here), or the model named."""
    started = time.perf_counter()
    if args.model != "tiny":
        try:
            model, tokenizer = load_hf_policy(args.model, device="cpu")
        except PolicyLoadError as e:
            raise SystemExit(f"credit_quality.py: error: {e}") from None

        folder = resolve_model(args.model, progress=progress)
        label = args.model if not Path(args.model).exists() else Path(args.model).resolve().name
        model.eval()
        return model, tokenizer, label, folder, time.perf_counter() - started

    warm = out / f"warmstart-{args.warm_start}-{args.train_games}games"
    if not (warm / "model" / "config.json").exists():
        spec = FAMILIES["alfworld"]
        env_options = {**spec.options, "max_turns": PICK_TINY.max_turns,
                       "panel_size": {"train": args.train_games, "valid_seen": 0, "valid_unseen": 0}}
        literate = {"sft_privileged": args.literate_share} if args.warm_start == "literate" else {}
        # the tiny recipe's warm start (trainer/recipes.py), on this benchmark's games, episodes and epochs
        model = {**TINY_QWEN3, "tiny_hidden": args.tiny_hidden, "tiny_layers": args.tiny_layers}
        config = TrainConfig(
            env_id=spec.env, out=str(warm), method="grpo", env_options=env_options, sft_episodes=args.sft_episodes,
            sft_epochs=args.sft_epochs, sft_noise=PICK_TINY.sft_noise, sft_lr=PICK_TINY.sft_lr, steps=0,
            save_every=0, eval_episodes=0, seed=args.seed, device="cpu", **model, **literate,
        )
        LocalTrainer(config, progress=progress).run()
    model, tokenizer = load_policy(str(warm / "model"), device="cpu")
    model.eval()
    label = f"tiny-{args.warm_start}" + ("" if args.train_games == 1000 else f"-{args.train_games}games")
    return model, tokenizer, label, warm / "model", time.perf_counter() - started


def load_teacher(args, tokenizer) -> tuple[Any, str]:
    """(model, "@label") of `--teacher-model`: it must read the student's token ids (the same vocabulary)."""
    try:
        teacher, teacher_tokenizer = load_hf_policy(args.teacher_model, device="cpu")
    except PolicyLoadError as e:
        raise SystemExit(f"credit_quality.py: error: --teacher-model: {e}") from None
    if teacher_tokenizer.get_vocab() != tokenizer.get_vocab():
        raise SystemExit(f"credit_quality.py: error: --teacher-model {args.teacher_model} has another tokenizer than "
                         "the student; the teacher scores the student's token ids, so both need the same vocabulary")
    teacher.eval()
    label = args.teacher_model if not Path(args.teacher_model).exists() else Path(args.teacher_model).resolve().name
    return teacher, f"@{label}"


def family_settings(args, spec: FamilySpec) -> dict[str, Any]:
    options = dict(spec.options)
    if spec.name == "alfworld":
        options["panel_size"] = {"train": args.train_games, "valid_seen": 0, "valid_unseen": 0}
    options["max_turns"] = args.max_turns or spec.max_turns
    return {"env": spec.env, "options": options, "tasks": args.tasks, "group_size": args.group_size,
            "detour": spec.detour if args.detour is None else args.detour, "free_form_detours": spec.free_form_detours,
            "policy_episodes": args.policy_episodes, "seed": args.seed}


def play_episodes(settings: dict, model, tokenizer, progress: bool) -> list:
    env_id, options = settings["env"], settings["options"]
    make_env = lambda: agentgym_opsd.make(env_id, **options, turn_labels=True)  # noqa: E731
    g = settings["group_size"]
    requests = [EpisodeRequest(seed=50_000 + t, episode_id=f"t{t}-g{i}", group=f"t{t}")
                for t in range(settings["tasks"]) for i in range(g)]
    expert = PerturbedExpert(settings["detour"], seed=settings["seed"], free_form_detours=settings["free_form_detours"])
    episodes = run_episodes(make_env, expert, requests, num_envs=min(len(requests), 16), context="full",
                            progress="expert with detours" if progress else False)
    if settings["policy_episodes"]:
        agent = HFPolicyAgent(model, tokenizer, max_new_tokens=64, temperature=1.0, seed=settings["seed"],
                              name="policy")
        # policy group t replays expert group t's game (the same reset seed), as a group of its own
        more = [EpisodeRequest(seed=50_000 + t, episode_id=f"p{t}-g{i}", group=f"p{t}")
                for t in range(max(1, settings["policy_episodes"] // g)) for i in range(g)]
        played = run_episodes(make_env, agent, more, num_envs=len(more), context="full",
                              progress="policy" if progress else False)
        agent.annotate(played)
        episodes += played
    return [e for e in episodes if e.error is None]


LIVE = {"teacher_mode": "live", "decay_steps": 0}  # every context's credit: a live teacher, no lambda decay


@dataclasses.dataclass
class FamilyScores:
    """One family's episodes, their token rows and every log-prob pass (steps 1-3 of the module docstring).

    clean: rows scoring whole responses; action_rows: rows scoring the family's span (`action_mode`,
    the same tokens). passes: name -> the cached pass (`student`, then each teacher context; with
    `-<action_mode>` where the action span has passes of its own). same_start: the action span's
    hindsight log-probs are read from the whole response's passes. note_sources: where each placebo
    note comes from."""

    episodes: list
    clean: Any
    action_rows: Any
    action_mode: str
    passes: dict[str, dict]
    same_start: bool
    note_sources: dict[str, dict]

    def teacher(self, context: str, rows) -> dict:
        """The pass of teacher context `context` scored over `rows`' spans."""
        if rows is self.clean or self.same_start:
            return self.passes[context]
        return self.passes[f"{context}-{self.action_mode}"]


def family_cache(args, spec: FamilySpec, model_label: str, model_folder: Path, out: Path) -> tuple[dict, Path]:
    """(the family's settings, the cache folder of this model and those settings)."""
    settings = family_settings(args, spec)
    key = {"model": model_fingerprint(model_folder), **settings}
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:10]
    cache = out / "cache" / f"{model_label}-{spec.name}-{digest}"
    cache.mkdir(parents=True, exist_ok=True)
    atomic_write_json(cache / "settings.json", key)
    return settings, cache


def family_episodes(spec: FamilySpec, settings: dict, cache: Path, model, tokenizer, log, progress: bool) -> list:
    """1. The family's episodes, played once and cached."""
    episodes_file = cache / "episodes.jsonl"
    if episodes_file.is_file():
        episodes = load_episodes(episodes_file)
        log(f"{len(episodes)} episodes from {episodes_file}")
    else:
        episodes = play_episodes(settings, model, tokenizer, progress)
        save_episodes(episodes_file, episodes)
    if not episodes:
        raise SystemExit(f"credit_quality.py: error: every {spec.env} episode failed; see the log above")
    return episodes


def teacher_contexts(spec: FamilySpec, episodes: list, cache: Path) -> tuple[dict, dict]:
    """Each privileged context's (episodes, credit config), and where the placebo notes come from."""
    contexts = {
        "full": (episodes, credit_config(spec.env, "stepopsd", span_mode="clean_step", **LIVE)),
        "outcome": (episodes, credit_config(spec.env, "stepopsd", span_mode="clean_step", hindsight_reference=False,
                                            hindsight_peer=False, **LIVE)),
        "placebo": (placebo_episodes(episodes), credit_config(spec.env, "stepopsd", span_mode="clean_step", **LIVE)),
    }
    types = [e.task_type for e in episodes]
    note_sources = {"family note": write_placebo_notes(cache / "placebo-notes", spec, types),
                    "whole note": write_placebo_notes(cache / "placebo-notes-all", spec, types, general=True)}
    contexts["skills"] = (episodes, credit_config(spec.env, "agentopsd", **LIVE))
    for name, folder in (("skills-placebo", "placebo-notes"), ("skills-placebo-all", "placebo-notes-all")):
        contexts[name] = (episodes, credit_config(spec.env, "agentopsd", skills_dir=str(cache / folder), **LIVE))
    return contexts, note_sources


def score_family(args, spec: FamilySpec, episodes: list, model, tokenizer, cache: Path, log, commit: str,
                 progress: bool, teacher: tuple[Any, str] | None = None) -> FamilyScores:
    """2. The rows (the family's span for StepOPSD, GRPO, GiGPO; the whole response for AgentOPSD,
    RLSD), and 3. the student's and every teacher context's log-probs, each once (cached). `teacher`:
    (model, tag) of another model that scores the teacher's contexts (its passes cached under the tag);
    None: the student is its own live teacher."""
    teacher_model, tag = teacher if teacher is not None else (model, "")
    import torch
    from tqdm.auto import tqdm

    action_mode = credit_config(spec.env, "stepopsd").span_mode
    rows_for = {"clean_step": build_rows(episodes, tokenizer, span_mode="clean_step")}
    if action_mode != "clean_step":
        rows_for[action_mode] = build_rows(episodes, tokenizer, span_mode=action_mode)
        if not torch.equal(rows_for[action_mode].input_ids, rows_for["clean_step"].input_ids):
            raise RuntimeError("rows of the two span modes hold different tokens")
    clean = rows_for["clean_step"]
    action_rows = rows_for[action_mode]
    contexts, note_sources = teacher_contexts(spec, episodes, cache)
    # The action span's hindsight context is the whole response's when every action starts its response.
    same_start = action_mode == "clean_step" or spans_start_together(action_rows, clean)
    steps = ["student", *contexts] + ([] if same_start else [f"{c}-{action_mode}" for c in HINDSIGHT_CONTEXTS])
    digest_clean = rows_digest(clean)
    passes: dict[str, dict] = {}
    bar = tqdm(steps, desc=f"{spec.name} log-probs", unit="pass", disable=not progress)
    for name in bar:
        bar.set_postfix_str(name)
        if name == "student":
            passes[name] = cached_scores(cache / "student.pt", digest_clean, lambda: {
                "logprobs": row_logprobs(model, clean, temperature=1.0, micro_batch_tokens=args.micro_batch_tokens,
                                     progress="student" if progress else False)}, log, commit)
            continue
        base = name.removesuffix(f"-{action_mode}")
        eps, config = contexts[base]
        rows = clean
        if base != name:
            rows, config = action_rows, dataclasses.replace(config, span_mode=action_mode)

        def score(eps=eps, rows=rows, config=config, name=name):
            scores = score_teacher(teacher_model, tokenizer, eps, rows, config, temperature=1.0,
                                   micro_batch_tokens=args.micro_batch_tokens, progress=name if progress else False)
            return {"logprobs": scores.logprobs, "scored": scores.scored, "truncated": int(scores.truncated),
                    "stats": scores.stats()}

        passes[name] = cached_scores(cache / f"teacher-{name}{tag}.pt", context_digest(eps, config, rows_digest(rows)),
                                     score, log, commit)
    bar.close()
    return FamilyScores(episodes, clean, action_rows, action_mode, passes, same_start, note_sources)


def credit_items(spec: FamilySpec, scores: FamilyScores, tokenizer, progress: bool) -> dict[str, EpisodeItems]:
    """4. Every method's credit from the passes (`compute_advantages(..., return_parts=True)`), as the
    per-episode items the AUCs read."""
    from tqdm.auto import tqdm

    episodes, clean, action_rows = scores.episodes, scores.clean, scores.action_rows
    student = scores.passes["student"]["logprobs"]
    labels = {e.episode_id: e.hindsight.details["turn_labels"] for e in episodes}

    def credit(method: str, rows, context: str | None, **overrides):
        config = credit_config(spec.env, method, **LIVE, **overrides)
        if context is None:
            batch = rows.credit_batch(student)
        else:
            t = scores.teacher(context, rows)
            batch = rows.credit_batch(student, t["logprobs"], t["scored"], t["truncated"])
        _, _, parts = compute_advantages(batch, config, 0, return_parts=True)
        return parts

    marks: dict = {}
    variants = {
        "grpo": ("grpo", action_rows, None, {}),
        "gigpo": ("gigpo", action_rows, None, {}),
        "stepopsd": ("stepopsd", action_rows, "full", {}),
        "stepopsd outcome only": ("stepopsd", action_rows, "outcome", {}),
        "stepopsd placebo": ("stepopsd", action_rows, "placebo", {}),
        "stepopsd-nobudget": ("stepopsd", action_rows, "full", {"budget": False}),
        "agentopsd": ("agentopsd", clean, "skills", {}),
        "agentopsd placebo family note": ("agentopsd", clean, "skills-placebo", {}),
        "agentopsd placebo note": ("agentopsd", clean, "skills-placebo-all", {}),
        "rlsd": ("rlsd", clean, "full", {}),
    }
    items: dict[str, EpisodeItems] = {}
    for name, (method, rows, context, overrides) in tqdm(variants.items(), desc=f"{spec.name} credit", unit="method",
                                                         disable=not progress, leave=False):
        parts = credit(method, rows, context, **overrides)
        items[name] = EpisodeItems(episodes, rows, student, parts, tokenizer, labels, marks)
    return items


EVIDENCE_ROWS = {"evidence: hindsight full": "stepopsd", "evidence: hindsight outcome only": "stepopsd outcome only",
                 "evidence: hindsight placebo": "stepopsd placebo", "evidence: skill note": "agentopsd",
                 "evidence: placebo family note": "agentopsd placebo family note",
                 "evidence: placebo note": "agentopsd placebo note"}
# paired differences: does the teacher read, or does any privileged text do?
COMPARISONS = [("stepopsd", "stepopsd placebo"), ("stepopsd", "stepopsd outcome only"),
               ("evidence: hindsight full", "evidence: hindsight placebo"),
               ("beyond lp_S: hindsight full", "beyond lp_S: hindsight placebo"),
               ("agentopsd", "agentopsd placebo note"), ("agentopsd", "agentopsd placebo family note"),
               ("evidence: skill note", "evidence: placebo note"),
               ("beyond lp_S: skill note", "beyond lp_S: placebo note")]


def bootstrap_units(episodes: Sequence[Any]) -> list[str]:
    """Each episode's bootstrap unit: its game (env and task id), so that the groups that played one game
    (an expert group and the policy group that replays it; two seeds that land on the same game of a
    small panel) are drawn together, never as two independent units."""
    return [f"{e.env_id}::{e.task_id}" for e in episodes]


def auc_tables(args, episodes: list, items: dict[str, EpisodeItems]) -> tuple[dict, dict, dict]:
    """5. The AUCs with one set of task draws for every cell: (results: row -> column -> interval,
    paired differences, the evidence's slope and correlation against the student's log-prob)."""
    success = np.array([e.success for e in episodes])
    rng = np.random.default_rng(args.seed)
    draws = resample_counts(bootstrap_units(episodes), args.bootstrap, rng)
    ones = np.ones((1, len(episodes)), dtype=np.int64)
    n_side = {"success": int(success.sum()), "failure": int((~success).sum())}
    raw: dict[str, dict[str, np.ndarray]] = {}  # row -> column -> [point, *draws], for the differences

    def cell(row: str, column: str, fn, values) -> dict:
        point, spread = fn(values, ones)[0], fn(values, draws)
        raw.setdefault(row, {})[column] = np.concatenate([[point], spread])
        return interval(point, spread, n_side[column.split("/")[1]])

    results: dict[str, dict[str, dict]] = {}

    def add_row(row: str, turn_items: list | None, token_items: list | None):
        cells = {}
        for side in ("success", "failure"):
            if turn_items is not None:
                cells[f"turn/{side}/within"] = cell(row, f"turn/{side}/within", within_auc,
                                                    side_items(turn_items, success, side))
            if token_items is not None and any(side_items(token_items, success, side)):
                cells[f"token/{side}"] = cell(row, f"token/{side}", pooled_auc, side_items(token_items, success, side))
        results[row] = cells

    for name, it in items.items():
        budgeted = name.startswith("stepopsd") and name != "stepopsd-nobudget"  # judged at token level only
        add_row(name, None if budgeted else it.turn_credit,
                it.token_credit if any(x is not None for x in it.token_credit) else None)
    for row, source in EVIDENCE_ROWS.items():
        add_row(row, items[source].evidence, items[source].token_gap)
    confidence: dict[str, dict] = {}
    for row, source in EVIDENCE_ROWS.items():
        label = row.removeprefix("evidence: ")
        cells, confidence[label] = {}, {}
        for side in ("success", "failure"):
            paired = side_items(items[source].paired, success, side)
            point, b_point = beyond_auc(paired, ones)
            spread, b_draws = beyond_auc(paired, draws)
            column = f"turn/{side}/within"
            raw.setdefault(f"beyond lp_S: {label}", {})[column] = np.concatenate([point, spread])
            cells[column] = interval(point[0], spread, n_side[side])
            flat = np.array([t for item in paired if item is not None for t in zip(item[0], item[1], strict=True)])
            if len(flat) >= 3 and flat[:, 1].std() > 0:
                finite = b_draws[np.isfinite(b_draws)]
                confidence[label][side] = {
                    "r": float(np.corrcoef(flat[:, 0], flat[:, 1])[0, 1]), "b": float(b_point[0]),
                    "b_low": float(np.percentile(finite, 2.5)) if len(finite) else None,
                    "b_high": float(np.percentile(finite, 97.5)) if len(finite) else None}
        results[f"beyond lp_S: {label}"] = cells
    add_row("student log-prob", items["stepopsd"].student, items["stepopsd"].token_student)
    differences = {}
    for a, b in COMPARISONS:
        for column in COLUMNS:
            if column in raw.get(a, {}) and column in raw.get(b, {}):
                d = raw[a][column] - raw[b][column]
                differences[f"{a} - {b} | {column}"] = interval(d[0], d[1:], n_side[column.split("/")[1]])
    return results, differences, confidence


def family_table(args, spec: FamilySpec, settings: dict, scores: FamilyScores, model_label: str, results: dict,
                 differences: dict, confidence: dict) -> list[str]:
    """The family's table: the header (env, episodes, model), one row per credit or signal, the paired
    differences, the evidence's slope against the student's log-prob, where the placebo notes come from."""
    episodes = scores.episodes
    success = np.array([e.success for e in episodes])
    progress_share = float(np.mean([lab["progress"] for e in episodes for lab in e.hindsight.details["turn_labels"]]))
    header = (
        f"{spec.env} ({', '.join(f'{k}={v}' for k, v in settings['options'].items() if k not in ('progress',))}); "
        f"{len(episodes)} episodes ({args.tasks} tasks x {args.group_size}, the expert with detours "
        f"p={settings['detour']}{', + policy rollouts' if args.policy_episodes else ''}): {100 * success.mean():.0f}% "
        f"success, {sum(e.num_turns for e in episodes)} turns, {100 * progress_share:.0f}% of turns progress | model "
        f"{model_label}, student and live "
        f"teacher | AUC [95% interval, {args.bootstrap} draws of games]")
    lines = [header, f"{'':<36}" + "".join(f"{c:>22}" for c in COLUMNS)]

    def show(v):
        if not v or v.get("auc") is None:
            return "-"
        return f"{v['auc']:.2f} [{v['low']:.2f}, {v['high']:.2f}]"

    for name, cells in results.items():
        lines.append(f"{name:<36}" + "".join(f"{show(cells.get(c)):>22}" for c in COLUMNS))
    lines.append("paired differences (same draws):")
    for name, v in differences.items():
        a_b, column = name.split(" | ")
        lines.append(f"  {a_b:<60} {column:<20} {v['auc']:+.2f} [{v['low']:+.2f}, {v['high']:+.2f}]"
                     if v["auc"] is not None else f"  {a_b:<60} {column:<20} -")
    for label, sides in confidence.items():
        lines.append(f"e_k ({label}) against lp_S of the span: " + "; ".join(
            f"{side} r = {v['r']:+.2f}, slope {v['b']:+.2f}"
            + (f" [{v['b_low']:+.2f}, {v['b_high']:+.2f}]" if v["b_low"] is not None else "")
            for side, v in sides.items()))
    shared = ("the family scores whole responses" if scores.action_mode == "clean_step"
              else "the action span's hindsight log-probs come from the whole response's passes" if scores.same_start
              else "the action span has its own hindsight passes")
    lines.append("placebo notes: " + "; ".join(f"{kind}: " + ", ".join(f"{k} <- {v}" for k, v in sources.items())
                                              for kind, sources in scores.note_sources.items()) + f"; {shared}")
    return lines


def pass_costs(passes: dict[str, dict]) -> tuple[dict, list[str]]:
    """What each forward pass cost when it was first computed (seconds, commit, load, date, tokens), and
    the table's lines saying so."""
    cost = {name: {"seconds": round(float(p.get("seconds", 0)), 1), "commit": p.get("commit"), "load": p.get("load"),
                   "date": p.get("date"), **({"tokens": p["stats"].get("teacher/tokens")} if "stats" in p else {})}
            for name, p in passes.items()}
    lines = ["forwards, when first computed (s): " + ", ".join(f"{k} {v['seconds']:.0f}" for k, v in cost.items())]
    when = sorted({(v["date"], v["commit"]) for v in cost.values() if v["date"]})
    loads = [x for v in cost.values() if v["load"] for x in v["load"]]
    if when:
        lines.append(f"  computed {when[0][0]} to {when[-1][0]} at commit(s) "
                     f"{', '.join(sorted({c for _, c in when}))}, "
                     f"load {min(loads):.1f} to {max(loads):.1f} (1-min average at each pass's start and end)")
    return cost, lines


def run_family(args, spec: FamilySpec, model, tokenizer, model_label: str, model_folder: Path, out: Path,
               progress: bool, teacher: tuple[Any, str] | None = None) -> dict[str, Any]:
    """One family, steps 1-5 of the module docstring: its report (also written as
    OUT/credit_quality-<model>-<family>.json and .txt)."""
    from tqdm.auto import tqdm

    started = time.perf_counter()
    load_before, commit = os.getloadavg(), git_commit()
    settings, cache = family_cache(args, spec, model_label, model_folder, out)
    log = (lambda msg: tqdm.write(f"[{spec.name}] {msg}")) if progress else (lambda msg: None)
    episodes = family_episodes(spec, settings, cache, model, tokenizer, log, progress)
    scores = score_family(args, spec, episodes, model, tokenizer, cache, log, commit, progress, teacher)
    items = credit_items(spec, scores, tokenizer, progress)
    results, differences, confidence = auc_tables(args, episodes, items)

    lines = family_table(args, spec, settings, scores, model_label, results, differences, confidence)
    if teacher:
        lines.insert(1, f"teacher: {teacher[1][1:]} scores every teacher context (the student, {model_label}, "
                        "its own log-probs)")
    cost, cost_lines = pass_costs(scores.passes)
    wall = time.perf_counter() - started
    load_after = os.getloadavg()
    lines += cost_lines
    lines.append(f"this run: commit {commit}; load {load_before[0]:.1f} -> {load_after[0]:.1f} (1-min average); "
                 f"{wall:.0f}s; {args.threads} torch thread(s)")
    table = "\n".join(lines)
    success = np.array([e.success for e in episodes])
    labels = [lab["progress"] for e in episodes for lab in e.hindsight.details["turn_labels"]]
    report = {"args": {k: v for k, v in vars(args).items() if k != "families"}, "family": spec.name,
              "settings": settings, "model": model_label,
              "teacher": teacher[1][1:] if teacher else "the student (live)", "success": float(success.mean()),
              "episodes": len(episodes),
              "turns": sum(e.num_turns for e in episodes), "progress_share": float(np.mean(labels)),
              "results": results, "differences": differences, "confidence": confidence,
              "placebo_notes": scores.note_sources, "action_span_shares_passes": scores.same_start,
              "passes": cost, "wall_seconds": wall, "load": [load_before, load_after], "commit": commit,
              "table": table}
    if spec.name == "alfworld":
        report["goals"] = goals(report)
        table += "\ngoals (issue 27):\n  " + "\n  ".join(report["goals"])
        report["table"] = table
    stem = out / f"credit_quality-{model_label}{teacher[1] if teacher else ''}-{spec.name}"
    atomic_write_json(stem.with_suffix(".json"), report)
    atomic_write_text(stem.with_suffix(".txt"), table + "\n")
    return report


def spans_start_together(rows, wider) -> bool:
    """Whether every turn's span in `rows` starts where its span in `wider` (the same tokens, a wider span
    mode) does: then the StepOPSD teacher inserts its block at the same place for both, and the log-probs
    of the narrower span are those of the wider pass (causal attention: later tokens change nothing)."""
    for r in range(rows.num_rows):
        narrow, wide = _first_positions(rows, r), _first_positions(wider, r)
        if any(wide.get(k) != p for k, p in narrow.items()):
            return False
    return True


def _first_positions(rows, r: int) -> dict[int, int]:
    """{turn: the row position of its span's first token} for row r (positions >= 1, as the teacher scores)."""
    import torch

    L = int(rows.length[r])
    span = rows.span[r, :L] & (rows.turn_id[r, :L] >= 0)
    span[0] = False
    out = {}
    turn = rows.turn_id[r, :L]
    for k in torch.unique(turn[span]).tolist():
        out[int(k)] = int((span & (turn == k)).nonzero()[0])
    return out


def goals(report: dict) -> list[str]:
    """The issue's goals for ALFWorld, checked: StepOPSD token level > 0.70 and AgentOPSD turn level > 0.65
    in successful episodes, intervals above 0.5, and the placebos within 0.05 of 0.5."""
    r = report["results"]

    def check(row, column, above):
        v = r.get(row, {}).get(column)
        if not v or v["auc"] is None:
            return f"{row} {column}: -"
        ok = v["auc"] > above and v["low"] > 0.5
        return (f"{row} {column} {v['auc']:.2f} [{v['low']:.2f}, {v['high']:.2f}] > {above} and above 0.5: "
                f"{'met' if ok else 'NOT met'}")

    def placebo(row, column):
        v = r.get(row, {}).get(column)
        if not v or v["auc"] is None:
            return f"{row} {column}: -"
        ok = abs(v["auc"] - 0.5) <= 0.05
        return f"{row} {column} {v['auc']:.2f} within 0.05 of 0.5: {'met' if ok else 'NOT met'}"

    return [check("stepopsd", "token/success", 0.70), check("agentopsd", "turn/success/within", 0.65),
            placebo("stepopsd placebo", "token/success"), placebo("agentopsd placebo note", "turn/success/within"),
            placebo("agentopsd placebo family note", "turn/success/within")]


def results_page_body(reports: list[dict]) -> str:
    """The results page's figures, per family: what was played, each credit's or signal's AUCs with their
    intervals, the paired differences, and (ALFWorld) the goals checked (`reports` as run_family returns them)."""
    def cell(v: dict | None, sign: str = "") -> str:
        if not v or v.get("auc") is None:
            return "-"
        return f"{v['auc']:{sign}.2f} [{v['low']:{sign}.2f}, {v['high']:{sign}.2f}]"

    parts = []
    for report in reports:
        rows = [[name, *(cell(cells.get(c)) for c in COLUMNS)] for name, cells in report["results"].items()]
        differences = [[*name.split(" | ", 1), cell(v, "+")] for name, v in report["differences"].items()]
        parts += [f"## {report['family']}, model {report['model']}",
                  report["table"].splitlines()[0].replace("|", ";"),
                  markdown_table(["credit or signal", *COLUMNS], rows),
                  "Paired differences (the same draws):\n\n"
                  + markdown_table(["difference", "column", "AUC difference [95% interval]"], differences)]
        if report.get("goals"):
            parts.append("Goals:\n\n" + "\n".join(f"- {g}" for g in report["goals"]))
    return "\n\n".join(parts)


def main(argv=None) -> int:
    args = parse_args(argv)
    command = benchmark_command("credit_quality", argv)
    import torch

    torch.set_num_threads(args.threads)
    agentgym_opsd.load_plugins()
    progress = not args.no_progress
    out = Path(args.out)
    model, tokenizer, label, folder, load_seconds = load_model(args, out, progress)
    teacher = load_teacher(args, tokenizer) if args.teacher_model else None
    reports = []
    for spec in args.families:
        report = run_family(args, spec, model, tokenizer, label, folder, out, progress, teacher)
        reports.append(report)
        print(report["table"])
        print(f"written: {out}/credit_quality-{label}{teacher[1] if teacher else ''}-{spec.name}.json and .txt\n",
              flush=True)
    print(f"model ready in {load_seconds:.0f}s")
    if args.page and reports:
        page = write_results_page(
            "credit_quality", "Does per-turn credit land on the turns that mattered? Each method's AUC against the "
            "env's oracle", results_page_body(reports), command=command, threads=args.threads,
            commit=reports[0]["commit"], load=[round(reports[0]["load"][0][0], 2), round(reports[-1]["load"][1][0], 2)])
        print(f"results page: {page}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
