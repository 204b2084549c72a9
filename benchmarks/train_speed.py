"""Which weights to train, in which precision: tokens/s of an SFT pass and of an RL update, and quality at equal budget.

    .venv/bin/python -m benchmarks.train_speed --quick    # 4 episodes, 2 rounds, 24 + 8 quality episodes (~30 min here)
    .venv/bin/python -m benchmarks.train_speed            # 12 episodes, 2 rounds, 120 + 40 quality episodes
    .venv/bin/python -m benchmarks.train_speed --rates 2  # also a third of each choice's learning rate

Model: `--model` (default `smollm2-135m`, SmolLM2-135M-Instruct, 30 layers) in float32 weights, on the CPU,
torch on one thread (`torch.set_num_threads(1)`; a second thread beside another job's is many times
slower on this 2-core machine).

1. Rows: `--episodes` N episodes of ALFWorld Pick in small rooms (a Pick-only panel of 200 training
   games, `expert_searches=True`, at most 15 turns) played by the searching expert with random detours
   (`PerturbedExpert`, p = 0.25), in groups of 4 episodes per game (so GRPO has groups with mixed
   outcomes), full chat; token rows by `trainer.rows.build_rows` with the model's tokenizer.
2. Speed, each choice of trained weights (full, the top 8 or 4 layers, LoRA r=16 on every layer or the
   top 8) x precision (fp32; bf16 autocast where `cpu_has_fast_bf16()`), in `--rounds` interleaved
   rounds (the order reversed every other round), each from a fresh copy of the model:
   (a) one SFT pass over the rows (`sft_epoch`, targets the expert's own turns, `--batch-tokens`
       padded tokens per optimizer step, the rows' shared start on, as the warm start runs it);
   (b) one RL update on the same rows: the old log-probs (`row_logprobs`), GRPO advantages from the
       episodes' outcomes (`compute_advantages`), `ppo_update` (one mini-batch, micro-batches of
       `--batch-tokens`).
   Then, for the fastest choice, side by side in rounds of their own: the SFT pass with the shared
   start off; window:2 rows of the same episodes against full chat (SFT and RL); a no-grad forward with
   logits everywhere (`model(...).logits`, log_softmax over the sequence) against logits only where
   read (`token_logprobs`, without and with the shared start).
   tokens/s = row tokens (real tokens, pads excluded) / process CPU seconds (one thread: what the work
   costs, robust to other jobs taking the core; wall seconds are kept in the json); min and median over
   rounds; `x full` = full-FT fp32's time over this one's, for the same episodes (for window rows, whose
   rows repeat the instructions, the time ratio, not a token-rate ratio).
3. Quality at equal budget: each choice (in bf16 when it measured faster, else fp32) fine-tunes a fresh
   copy for one epoch on the expert's own turns of `--quality-episodes` Q successful expert episodes
   (p = 0.25 detours, as the warm start) at its learning rate (`--rates 2`: also a third of it, the
   better one chosen on `--val-episodes` valid_seen games that are not among the held-out ones). Then
   on the expert's own turns of `--held-out` H successful episodes of valid_seen games (other games):
   NLL per target token, and the turn exact-match rate: the share of held-out turns where every token
   of the expert's turn (its closing <|im_end|> included) is the model's argmax given the context
   before it, which is the same as the model's greedy turn (stopping at <|im_end|>) equalling the
   expert's token for token. Also the untrained model's. Quality is equal to the best when the paired
   bootstrap 95% interval (over held-out episodes) of the NLL difference reaches within 2% of the best NLL.
4. One table, a recommendation line (`fastest at equal quality: ...`), OUT/train_speed.json and .txt,
   OUT/train_speed.png. `--resume` reuses the measurements of an interrupted run with the same
   arguments (OUT/partial.json). `--page` also writes the report and the plot to docs/benchmarks/train_speed.md.
"""

from __future__ import annotations

import argparse
import copy
import math
import os
import statistics
import sys
import time
from pathlib import Path

import agentgym_opsd
from agentgym_opsd.io import atomic_write_json, atomic_write_text, read_json_file
from agentgym_opsd.rollout import EpisodeRequest, run_episodes
from benchmarks.common import (add_page_argument, benchmark_command, git_commit, load_average, page_plot, save_png,
                               timed, write_results_page)
from trainer.config import TrainConfig
from trainer.credit import compute_advantages
from trainer.env_knowledge import credit_config
from trainer.forward import decoder_and_head, row_logprobs, token_logprobs
from trainer.loss import micro_batches, ppo_update, row_batch
from trainer.optim import make_optimizer, set_learning_rate
from trainer.policy import autocast_context, cpu_has_fast_bf16, load_hf_policy
from trainer.recipes import PICK_ENV as ENV
from trainer.recipes import SFT_NOISE as NOISE
from trainer.rows import build_rows
from trainer.trainable import select_trainable
from trainer.warm_start import PerturbedExpert, SFTExample, sft_epoch, sft_targets

GROUP = 4  # episodes per game in the speed rows
# name -> select_trainable keywords
CHOICES: dict[str, dict[str, int]] = {
    "full": {},
    "top-8": {"train_layers": 8},
    "top-4": {"train_layers": 4},
    "lora16-all": {"lora_rank": 16},
    "lora16-top8": {"lora_rank": 16, "lora_layers": 8},
}
# the learning rate each choice fine-tunes at (`--rates 2` also tries a third of it; 3x diverged in a --quick run:
# held-out NLL 1.0-2.1 against 0.65-0.69, one epoch of AdamW without warm-up)
RATES = {"full": 5e-5, "top-8": 1e-4, "top-4": 1e-4, "lora16-all": 1e-3, "lora16-top8": 1e-3}
AUTOCAST = {"fp32": "none", "bf16": "bf16"}
QUALITY_TOLERANCE = 0.02  # equal quality: the NLL difference's interval reaches within 2% of the best NLL


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m", help="a named model or a transformers folder")
    ap.add_argument("--quick", action="store_true",
                    help="4 episodes, 24 quality episodes, 8 held out (the numbers given explicitly win)")
    ap.add_argument("--out", default="runs/train_speed")
    add_page_argument(ap)
    ap.add_argument("--rounds", type=int, default=2, help="interleaved speed rounds")
    ap.add_argument("--episodes", type=int, default=None, help="episodes in the speed rows (default 12; --quick 4)")
    ap.add_argument("--quality-episodes", type=int, default=None,
                    help="Q fine-tuning episodes (default 120; --quick 24)")
    ap.add_argument("--held-out", type=int, default=None, help="H held-out episodes (default 40; --quick 8)")
    ap.add_argument("--val-episodes", type=int, default=None,
                    help="episodes that choose between the rates with --rates 2 (default 12; --quick 4)")
    ap.add_argument("--rates", type=int, choices=(1, 2), default=1,
                    help="learning rates tried per choice: 1 (the choice's own) or 2 (also a third of it)")
    ap.add_argument("--choices", default=",".join(CHOICES),
                    help=f"comma-separated subset of {', '.join(CHOICES)} (full is always measured: the baseline)")
    ap.add_argument("--precisions", default="auto",
                    help="fp32, bf16, or auto: fp32 and bf16 where the CPU has bf16 units")
    ap.add_argument("--batch-tokens", type=int, default=4096,
                    help="padded tokens per SFT optimizer step and per RL micro-batch")
    ap.add_argument("--no-quality", dest="quality", action="store_false", help="the speed part only")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--resume", action="store_true", help="reuse OUT/partial.json from a run with the same arguments")
    ap.add_argument("--no-progress", dest="progress", action="store_false")
    args = ap.parse_args(argv)
    defaults = {"episodes": (12, 4), "quality_episodes": (120, 24), "held_out": (40, 8),
                "val_episodes": (12, 4)}
    for name, (full, quick) in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
    for name in ("rounds", *defaults):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.episodes < 2:
        ap.error(f"--episodes must be >= 2 (GRPO compares episodes of a game), got {args.episodes}")
    if args.batch_tokens < 256:
        ap.error(f"--batch-tokens must be >= 256, got {args.batch_tokens}")
    chosen = [c.strip() for c in args.choices.split(",") if c.strip()]
    unknown = [c for c in chosen if c not in CHOICES]
    if unknown or not chosen:
        ap.error(f"--choices {args.choices!r}: use a comma-separated subset of {', '.join(CHOICES)}")
    args.choices = ["full"] + [c for c in CHOICES if c in chosen and c != "full"]
    if args.precisions not in ("auto", "fp32", "bf16", "fp32,bf16", "bf16,fp32"):
        ap.error(f"--precisions {args.precisions!r}: use auto, fp32, bf16 or fp32,bf16")
    return args


# ---------------------------------------------------------------------------------------------
# Pure helpers (tests/benchmarks/test_train_speed.py)


def summarize_times(samples: list[dict[str, float]], tokens: int) -> dict[str, float]:
    """Min and median over rounds of CPU and wall seconds, and tokens/s from the CPU seconds."""
    cpu = [s["cpu_s"] for s in samples]
    wall = [s["wall_s"] for s in samples]
    return {"rounds": len(samples), "tokens": tokens, "cpu_s_min": min(cpu), "cpu_s_median": statistics.median(cpu),
            "wall_s_min": min(wall), "tok_s_min_time": tokens / min(cpu),
            "tok_s_median": tokens / statistics.median(cpu)}


def speed_table(summary: dict[str, dict[str, float]], baseline: str) -> list[dict]:
    """One row per case: tokens/s (from the min and the median CPU time) and `x_baseline`, the
    baseline's min time over this case's (the speed-up for the same episodes' work)."""
    if baseline not in summary:
        raise KeyError(f"the baseline {baseline!r} was not measured")
    base = summary[baseline]["cpu_s_min"]
    return [{"case": case, **s, "x_baseline": base / s["cpu_s_min"]} for case, s in summary.items()]


def turn_exact_match(hit, turn_id, target) -> tuple[int, int]:
    """(turns whose every target token is a hit, turns with a target token). `hit`, `turn_id`,
    `target`: [R, T] tensors; a turn is (row, turn id) over the target tokens."""
    import torch

    target = target.bool()
    rows, cols = torch.nonzero(target, as_tuple=True)
    if rows.numel() == 0:
        return 0, 0
    key = rows.long() * (int(turn_id.max()) + 2) + (turn_id[rows, cols].long() + 1)
    turns, inverse = torch.unique(key, return_inverse=True)
    missed = torch.zeros(turns.numel(), dtype=torch.long).index_add_(0, inverse, (~hit[rows, cols].bool()).long())
    return int((missed == 0).sum()), int(turns.numel())


def paired_nll_difference(nll_a, count, nll_b, *, draws: int = 2000, seed: int = 0) -> tuple[float, float, float]:
    """Per-token NLL of A minus B on the same episodes (each episode's NLL sums and target counts),
    and its 95% bootstrap interval over episodes."""
    import numpy as np

    a, b, n = (np.asarray(x, dtype=float) for x in (nll_a, nll_b, count))
    if not (a.shape == b.shape == n.shape) or n.sum() <= 0:
        raise ValueError("paired_nll_difference: equal-length per-episode sums with some target tokens")
    diff = (a.sum() - b.sum()) / n.sum()
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(a), size=(draws, len(a)))
    boot = (a[idx].sum(1) - b[idx].sum(1)) / np.maximum(n[idx].sum(1), 1e-9)
    low, high = np.percentile(boot, [2.5, 97.5])
    return float(diff), float(low), float(high)


def equal_quality(best_nll: float, low: float, tolerance: float = QUALITY_TOLERANCE) -> bool:
    """A choice's quality equals the best's when its NLL difference to the best (95% interval lower
    end `low`) reaches within `tolerance` x the best NLL."""
    return low <= tolerance * best_nll


def recommend(speed: dict[str, float], quality: dict[str, bool]) -> str | None:
    """The fastest (least CPU seconds for an SFT pass and an RL update) of the choices whose quality is
    equal to the best's; None when no choice has both figures."""
    candidates = [c for c in speed if quality.get(c)]
    return min(candidates, key=lambda c: speed[c]) if candidates else None


# ---------------------------------------------------------------------------------------------
# Machine facts


def cpu_flags() -> list[str]:
    """The CPU's matrix-unit flags (AMX, AVX-512, AVX2, FMA) from /proc/cpuinfo."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = line.split(":", 1)[1].split()
                    return sorted(f for f in flags if f.startswith(("amx", "avx512", "avx2", "avx_vnni", "fma")))
    except OSError:
        pass
    return []


# ---------------------------------------------------------------------------------------------
# The work measured


class Bench:
    """The model, its tokenizer and the measured operations (each from a fresh copy of the model)."""

    def __init__(self, args):
        import torch

        self.args = args
        self.base, self.tokenizer = load_hf_policy(args.model, device="cpu", dtype="float32")
        self.base.eval()
        self.base.requires_grad_(False)
        self.pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self.credit = credit_config(ENV, "grpo")
        self.config = TrainConfig(env_id=ENV, out=str(args.out), micro_batch_tokens=args.batch_tokens,
                                  sft_batch_tokens=args.batch_tokens, seed=args.seed)
        self.limit = int(getattr(self.base.config, "max_position_embeddings", 8192) or 8192)
        self.torch = torch

    def fresh(self, choice: str):
        """A copy of the model with only `choice`'s weights trainable, and its optimizer (the trainer's,
        `trainer.optim`, at the choice's rate)."""
        model = copy.deepcopy(self.base)
        model.requires_grad_(True)
        model = select_trainable(model, **CHOICES[choice])
        model.train()
        return model, make_optimizer(model, lr=RATES[choice], weight_decay=self.config.weight_decay)

    def rows(self, episodes, context: str | None = None):
        return build_rows(episodes, self.tokenizer, context=context, span_mode=self.credit.span_mode,
                          max_length=self.limit)

    @staticmethod
    def examples(rows, episodes, detours):
        """The warm start's SFT examples (`warm_start.sft`): each row's tokens, the expert's own turns as targets."""
        target, _ = sft_targets(rows, episodes, detours)
        out = [SFTExample(rows.input_ids[r, : int(rows.length[r])], target[r, : int(rows.length[r])])
               for r in range(rows.num_rows)]
        return [x for x in out if bool(x.target.any())], target

    def sft_pass(self, model, optimizer, examples, precision: str, *, share_prefix: bool = True) -> float:
        import numpy as np

        with autocast_context(AUTOCAST[precision], "cpu"):
            return sft_epoch(model, optimizer, examples, np.random.default_rng(self.args.seed), pad_token_id=self.pad,
                             batch_tokens=self.args.batch_tokens, max_grad_norm=self.config.max_grad_norm,
                             share_prefix=share_prefix)

    def rl_update(self, model, optimizer, rows, precision: str, lr: float) -> dict:
        """The trainer's update after a rollout, GRPO: old log-probs, advantages, `ppo_update`."""
        set_learning_rate(optimizer, lr)
        with autocast_context(AUTOCAST[precision], "cpu"):
            old = row_logprobs(model, rows, micro_batch_tokens=self.args.batch_tokens)
            advantages, _ = compute_advantages(rows.credit_batch(student_logprobs=old), self.credit, 0)
            return ppo_update(model, optimizer, rows, old, advantages, None, config=self.config, step=0,
                              temperature=1.0)

    def forward(self, model, rows, precision: str, how: str) -> float:
        """Log-probs of the rows' generated tokens, no grad, in micro-batches: `everywhere` (the full
        logits, log_softmax over the sequence), `read` (`token_logprobs`) or `read+prefix` (with the
        rows' shared start). Returns their sum (a check that every way scores the same)."""
        torch = self.torch

        total = 0.0
        with torch.no_grad(), autocast_context(AUTOCAST[precision], "cpu"):
            for index in micro_batches(rows.attention_mask.sum(-1).tolist(), self.args.batch_tokens):
                mb = row_batch(rows, index, "cpu")
                ids, mask, scored = mb["input_ids"], mb["attention_mask"], mb["generated"].clone()
                scored[:, 0] = False
                if how == "everywhere":
                    logits = model(input_ids=ids, attention_mask=mask).logits.float()
                    logp = torch.log_softmax(logits, dim=-1)[:, :-1].gather(-1, ids[:, 1:, None]).squeeze(-1)
                    total += float((logp * scored[:, 1:]).sum())
                else:
                    lp = token_logprobs(model, ids, mask, scored, share_prefix=how == "read+prefix")
                    total += float(lp.sum())
        return total

    def held_out(self, model, rows, target, precision: str) -> dict:
        """Per-episode NLL sums and target counts, and the turn exact-match counts (module docstring)."""
        torch = self.torch

        decoder, head = decoder_and_head(model)
        episodes = int(rows.row_episode.max()) + 1
        nll = torch.zeros(episodes, dtype=torch.float64)
        count = torch.zeros(episodes, dtype=torch.float64)
        matched = turns = hits = 0
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad(), autocast_context(AUTOCAST[precision], "cpu"):
                for index in micro_batches(rows.attention_mask.sum(-1).tolist(), self.args.batch_tokens):
                    mb = row_batch(rows, index, "cpu")
                    ids = mb["input_ids"]
                    tgt = target[torch.tensor(index), : ids.shape[1]].clone()
                    tgt[:, 0] = False
                    r, c = torch.nonzero(tgt[:, 1:], as_tuple=True)  # position c predicts token c + 1
                    if decoder is not None:
                        states = decoder(input_ids=ids, attention_mask=mb["attention_mask"]).last_hidden_state[r, c]
                        logits = head(states).float()
                    else:
                        logits = model(input_ids=ids, attention_mask=mb["attention_mask"]).logits[r, c].float()
                    truth = ids[r, c + 1]
                    lp = torch.log_softmax(logits, dim=-1).gather(-1, truth[:, None]).squeeze(-1)
                    hit = torch.zeros_like(tgt)
                    hit[r, c + 1] = logits.argmax(-1) == truth
                    hits += int(hit.sum())
                    episode = rows.row_episode[torch.tensor(index)][r]
                    nll.index_add_(0, episode, -lp.double())
                    count.index_add_(0, episode, torch.ones_like(lp, dtype=torch.float64))
                    m, n = turn_exact_match(hit, rows.turn_id[torch.tensor(index), : ids.shape[1]], tgt)
                    matched, turns = matched + m, turns + n
        finally:
            model.train(was_training)
        return {"nll_sum": nll.tolist(), "count": count.tolist(), "matched_turns": matched, "turns": turns,
                "nll": float(nll.sum() / count.sum().clamp(min=1)), "exact_match": matched / max(1, turns),
                "token_accuracy": hits / max(1.0, float(count.sum()))}


def play(env_options: dict, split: str, requests, *, seed: int, progress):
    """The searching expert with detours on `requests`; (episodes, the expert)."""
    expert = PerturbedExpert(NOISE, seed=seed)
    options = {**env_options, "split": split}
    episodes = run_episodes(lambda: agentgym_opsd.make(ENV, **options), expert, requests,
                            num_envs=min(16, len(requests)), context="full", progress=progress)
    return [e for e in episodes if not e.error], expert


# ---------------------------------------------------------------------------------------------
# The run


class Measurements:
    """The measurements taken so far, kept in OUT/partial.json after each one (with the arguments they
    were taken with), so that `--resume` with the same arguments redoes none of them."""

    def __init__(self, args, out: Path, say) -> None:
        self.path = out / "partial.json"
        self.key_args = {k: v for k, v in vars(args).items() if k not in ("resume", "progress", "out")}
        self.done: dict = {}
        if args.resume and self.path.exists():
            saved = read_json_file(self.path)
            if saved.get("args") == self.key_args:
                self.done = saved.get("done", {})
                say(f"resuming: {len(self.done)} measurements from {self.path}")
            else:
                say(f"{self.path} is from a run with other arguments; starting over")

    def __contains__(self, key: str) -> bool:
        return key in self.done

    def __getitem__(self, key: str):
        return self.done[key]

    def keep(self, key: str, value) -> None:
        self.done[key] = value
        atomic_write_json(self.path, {"args": self.key_args, "done": self.done})


def speed_rows(args, bench: Bench, env_options: dict, progress, say) -> dict:
    """1. The rows: expert episodes with detours in groups of `GROUP` per game, full chat and window:2."""
    tasks = math.ceil(args.episodes / GROUP)
    requests = [EpisodeRequest(seed=150 + t, episode_id=f"speed-t{t}-g{g}", group=f"t{t}")
                for t in range(tasks) for g in range(GROUP)][: args.episodes]
    episodes, expert = play(env_options, "train", requests, seed=args.seed, progress=progress)
    rows = bench.rows(episodes)
    examples, target = bench.examples(rows, episodes, expert.detours)
    window_rows = bench.rows(episodes, context="window:2")
    window_examples, _ = bench.examples(window_rows, episodes, expert.detours)
    say(f"rows: {len(episodes)} episodes ({tasks} games, up to {GROUP} each, "
        f"{sum(e.success for e in episodes)} successes, "
        f"{sum(e.num_turns for e in episodes)} turns, {len(expert.detours)} detours), full chat: {rows.num_rows} rows, "
        f"{rows.num_tokens} tokens, {int(rows.generated_mask().sum())} generated, {int(target.sum())} SFT targets (the "
        f"expert's own turns); window:2: {window_rows.num_rows} rows, {window_rows.num_tokens} tokens")
    return {"episodes": episodes, "rows": rows, "examples": examples, "target": target, "window_rows": window_rows,
            "window_examples": window_examples}


def measure_speed(args, bench: Bench, data: dict, precisions: list[str], done: Measurements) -> dict:
    """2. Every choice x precision: one SFT pass and one RL update each, in interleaved rounds (the
    order reversed every other round), each from a fresh copy. Returns case -> its rounds' times."""
    from tqdm.auto import tqdm

    cases = [(c, p) for p in precisions for c in args.choices]
    samples: dict[str, list[dict]] = {}
    bar = tqdm(total=args.rounds * len(cases) * 2, desc="speed", unit="pass", disable=not args.progress)
    for rnd in range(args.rounds):
        order = cases if rnd % 2 == 0 else cases[::-1]
        for choice, precision in order:
            for what in ("sft", "rl"):
                key = f"speed/{rnd}/{choice}/{precision}/{what}"
                bar.set_postfix_str(f"{choice} {precision} {what}")
                if key not in done:
                    model, optimizer = bench.fresh(choice)
                    if what == "sft":
                        cpu, wall, _ = timed(lambda: bench.sft_pass(model, optimizer, data["examples"], precision))
                    else:
                        cpu, wall, _ = timed(lambda: bench.rl_update(model, optimizer, data["rows"], precision,
                                                                     RATES[choice]))
                    del model, optimizer
                    done.keep(key, {"cpu_s": cpu, "wall_s": wall, "load": load_average()})
                samples.setdefault(f"{choice}/{precision}/{what}", []).append(done[key])
                bar.update(1)
    bar.close()
    return samples


VARIANTS = ["sft/prefix", "sft/no-prefix", "sft/window", "rl/full-chat", "rl/window", "forward/everywhere",
            "forward/read", "forward/read+prefix"]


def measure_variants(args, bench: Bench, data: dict, fastest: str, precision: str,
                     done: Measurements) -> tuple[dict, dict]:
    """The fastest choice's variants side by side in rounds of their own: the shared start, window:2
    rows, logits everywhere. Returns (case -> its rounds' times, forward variant -> log-prob sum)."""
    from tqdm.auto import tqdm

    samples: dict[str, list[dict]] = {}
    checks: dict[str, float] = {}
    bar = tqdm(total=args.rounds * len(VARIANTS), desc=f"{fastest} {precision} variants", unit="pass",
               disable=not args.progress)
    for rnd in range(args.rounds):
        for case in VARIANTS if rnd % 2 == 0 else VARIANTS[::-1]:
            key = f"extra/{rnd}/{fastest}/{precision}/{case}"
            bar.set_postfix_str(case)
            if key not in done:
                model, optimizer = bench.fresh(fastest)
                kind, variant = case.split("/")
                if kind == "sft":
                    chosen = data["window_examples"] if variant == "window" else data["examples"]
                    fn = lambda: bench.sft_pass(model, optimizer, chosen, precision,  # noqa: E731
                                                share_prefix=variant != "no-prefix")
                elif kind == "rl":
                    chosen_rows = data["window_rows"] if variant == "window" else data["rows"]
                    fn = lambda: bench.rl_update(model, optimizer, chosen_rows, precision,  # noqa: E731
                                                 RATES[fastest])
                else:
                    model.eval()
                    fn = lambda: bench.forward(model, data["rows"], precision, variant)  # noqa: E731
                cpu, wall, result = timed(fn)
                del model, optimizer
                record = {"cpu_s": cpu, "wall_s": wall, "load": load_average()}
                if kind == "forward":
                    record["logprob_sum"] = result
                done.keep(key, record)
            samples.setdefault(case, []).append(done[key])
            if "logprob_sum" in done[key]:
                checks[case] = done[key]["logprob_sum"]
            bar.update(1)
    bar.close()
    return samples, checks


def measure_quality(args, bench: Bench, env_options: dict, precision: str, done: Measurements, progress,
                    say) -> dict:
    """3. Quality at equal budget: each choice fine-tunes a fresh copy for one epoch at its rate (and a
    third of it with `--rates 2`, the better one chosen on other games); held-out NLL and exact match."""
    from tqdm.auto import tqdm

    train_requests = [EpisodeRequest(seed=i, episode_id=f"quality-{i}") for i in range(args.quality_episodes)]
    held_requests = [EpisodeRequest(seed=i, episode_id=f"held-{i}") for i in range(args.held_out)]
    val_requests = [EpisodeRequest(seed=args.held_out + i, episode_id=f"val-{i}") for i in range(args.val_episodes)]
    train_eps, train_expert = play(env_options, "train", train_requests, seed=args.seed + 1, progress=progress)
    train_eps = [e for e in train_eps if e.success]  # as the warm start: successful episodes only
    train_rows = bench.rows(train_eps)
    train_examples, train_target = bench.examples(train_rows, train_eps, train_expert.detours)
    evals = {}
    for name, reqs in (("held_out", held_requests), ("val", val_requests if args.rates == 2 else [])):
        if not reqs:
            continue
        eps, ex = play(env_options, "valid_seen", reqs, seed=args.seed + 2, progress=progress)
        eps = [e for e in eps if e.success]
        ev_rows = bench.rows(eps)
        _, ev_target = bench.examples(ev_rows, eps, ex.detours)
        evals[name] = (ev_rows, ev_target, len(eps))
    say(f"quality: fine-tune on {len(train_eps)} successful expert episodes ({train_rows.num_tokens} tokens, "
        f"{int(train_target.sum())} targets), 1 epoch, {args.batch_tokens} padded tokens per step, "
        f"{precision}; "
        f"held out: {evals['held_out'][2]} successful episodes of valid_seen games "
        f"({int(evals['held_out'][1].sum())} target tokens)" + (
            f"; rates chosen on {evals['val'][2]} other valid_seen episodes" if "val" in evals else ""))
    if "quality/base" not in done:
        done.keep("quality/base", bench.held_out(bench.base, *evals["held_out"][:2], precision))
    quality: dict = {"untrained": done["quality/base"]}
    runs = [(c, RATES[c] * f) for c in args.choices for f in ((1.0, 1 / 3) if args.rates == 2 else (1.0,))]
    bar = tqdm(total=len(runs), desc="quality fine-tunes", unit="run", disable=not args.progress)
    for choice, lr in runs:
        key = f"quality/{choice}/{lr:.3g}"
        bar.set_postfix_str(f"{choice} lr {lr:g}")
        if key not in done:
            model, optimizer = bench.fresh(choice)
            set_learning_rate(optimizer, lr)
            cpu, wall, loss = timed(lambda: bench.sft_pass(model, optimizer, train_examples, precision))
            record = {"choice": choice, "lr": lr, "train_loss": loss, "cpu_s": cpu, "wall_s": wall,
                      "held_out": bench.held_out(model, *evals["held_out"][:2], precision)}
            if "val" in evals:
                record["val"] = bench.held_out(model, *evals["val"][:2], precision)
            del model, optimizer
            done.keep(key, record)
        record = done[key]
        score = record["val"]["nll"] if "val" in record else record["held_out"]["nll"]
        best = quality.get(choice)
        if best is None or score < (best["val"]["nll"] if "val" in best else best["held_out"]["nll"]):
            quality[choice] = record
        tried = {k: record[k] for k in ("choice", "lr", "train_loss", "cpu_s", "wall_s")}
        tried["held_out_nll"] = record["held_out"]["nll"]
        if "val" in record:
            tried["val_nll"] = record["val"]["nll"]
        quality.setdefault("_tried", []).append(tried)
        bar.update(1)
    bar.close()
    return quality


def report_speed(args, summary: dict, extra_summary: dict, checks: dict, trained: dict, tokens: int,
                 fastest: str, fastest_precision: str, say) -> list[dict]:
    """The speed table, the fastest choice's variants and what they show; returns the SFT table's rows."""
    table = speed_table({case: s for case, s in summary.items()}, "full/fp32/sft")
    rl_summary = {c: s for c, s in summary.items() if c.endswith("/rl")}
    rl_table = {r["case"]: r for r in speed_table(rl_summary, "full/fp32/rl")}
    say()
    say(f"Speed: tokens/s of one pass over {tokens} row tokens = tokens / process CPU s (1 thread); "
        f"min (best time) and median over {args.rounds} rounds; x full = full-FT fp32's best time / this one's")
    header = (f"{'choice':<13} {'trained':>8} {'prec':<5} {'SFT tok/s':>10} {'median':>7} {'x full':>7} "
              f"{'RL tok/s':>9} {'median':>7} {'x full':>7}")
    say(header)
    for r in table:
        if not r["case"].endswith("/sft"):
            continue
        choice, precision, _ = r["case"].split("/")
        rl = rl_table[f"{choice}/{precision}/rl"]
        say(f"{choice:<13} {trained[choice] / 1e6:>7.2f}M {precision:<5} {r['tok_s_min_time']:>10.0f} "
            f"{r['tok_s_median']:>7.0f} {r['x_baseline']:>7.2f} "
            f"{rl['tok_s_min_time']:>9.0f} {rl['tok_s_median']:>7.0f} {rl['x_baseline']:>7.2f}")
    base_sft, base_rl = summary["full/fp32/sft"]["cpu_s_min"], summary["full/fp32/rl"]["cpu_s_min"]
    say()
    say(f"Fastest (SFT + RL CPU time): {fastest} {fastest_precision}; its variants, side by side in "
        f"{args.rounds} rounds:")
    say(f"{'variant':<22} {'tokens':>7} {'CPU s':>7} {'tok/s':>7} {'median':>7} {'x full fp32':>11}")
    for case, s in extra_summary.items():
        base = base_rl if case.startswith("rl/") else base_sft
        ratio = f"{base / s['cpu_s_min']:>11.2f}" if not case.startswith("forward/") else f"{'':>11}"
        say(f"{case:<22} {s['tokens']:>7} {s['cpu_s_min']:>7.1f} {s['tok_s_min_time']:>7.0f} "
            f"{s['tok_s_median']:>7.0f} {ratio}")

    def times(a: str, b: str) -> float:  # variant a's best CPU time over variant b's
        return extra_summary[a]["cpu_s_min"] / extra_summary[b]["cpu_s_min"]

    say(f"  shared start: SFT x{times('sft/no-prefix', 'sft/prefix'):.2f} faster on; "
        f"window:2 rows cost x{times('sft/window', 'sft/prefix'):.2f} (SFT) and "
        f"x{times('rl/window', 'rl/full-chat'):.2f} (RL) the full chat's time for the "
        f"same episodes; logits only where read: forward x{times('forward/everywhere', 'forward/read'):.2f} faster "
        f"(x{times('forward/everywhere', 'forward/read+prefix'):.2f} with the shared "
        f"start); log-prob sums " + ", ".join(f"{k.split('/')[1]} {v:.2f}" for k, v in checks.items()))
    return table


def report_quality(args, quality: dict, precision: str, summary: dict, per_choice: dict, say) -> str | None:
    """The quality table (each choice's held-out NLL and exact match, its difference to the best with
    the interval, equal or not) and the recommendation; returns the choice recommended."""
    say()
    say(f"Quality at equal budget ({precision}; 1 epoch on the same episodes): held-out NLL per target "
        f"token, "
        f"turn exact match (greedy turn = expert's), share of target tokens that are the argmax, "
        f"difference to the best NLL with its 95% interval over episodes")
    best_choice = min(args.choices, key=lambda c: quality[c]["held_out"]["nll"])
    best = quality[best_choice]["held_out"]
    say(f"{'choice':<13} {'lr':>8} {'NLL':>7} {'exact':>6} {'tokens':>6} {'vs best [95%]':>24} {'equal':>6} "
        f"{'fine-tune':>10}")
    base = quality["untrained"]
    say(f"{'untrained':<13} {'-':>8} {base['nll']:>7.4f} {base['exact_match']:>6.1%} "
        f"{base['token_accuracy']:>6.1%}")
    equal: dict[str, bool] = {}
    for choice in args.choices:
        rec = quality[choice]
        d, low, high = paired_nll_difference(rec["held_out"]["nll_sum"], rec["held_out"]["count"], best["nll_sum"],
                                             seed=args.seed)
        equal[choice] = equal_quality(best["nll"], low)
        rec["vs_best"] = {"best": best_choice, "difference": d, "low": low, "high": high, "equal": equal[choice]}
        say(f"{choice:<13} {rec['lr']:>8.0e} {rec['held_out']['nll']:>7.4f} {rec['held_out']['exact_match']:>6.1%} "
            f"{rec['held_out']['token_accuracy']:>6.1%} "
            f"{f'{d:+.4f} [{low:+.4f}, {high:+.4f}]':>24} {'yes' if equal[choice] else 'no':>6} "
            f"{rec['wall_s']:>8.0f} s")
    say("  fine-tune times: wall (CPU) s: " + ", ".join(
        f"{t['choice']} lr {t['lr']:.0e} {t['wall_s']:.0f} ({t['cpu_s']:.0f})" + (
            f" val NLL {t['val_nll']:.4f}" if "val_nll" in t else "") for t in quality["_tried"]))
    speed_q = {c: per_choice[(c, precision)] for c in args.choices if (c, precision) in per_choice}
    recommendation = recommend(speed_q, equal)
    if recommendation is not None:
        r = recommendation
        sft_x = summary["full/fp32/sft"]["cpu_s_min"] / summary[f"{r}/{precision}/sft"]["cpu_s_min"]
        rl_x = summary["full/fp32/rl"]["cpu_s_min"] / summary[f"{r}/{precision}/rl"]["cpu_s_min"]
        say(f"fastest at equal quality: {r} in {precision} (SFT x{sft_x:.2f}, "
            f"RL x{rl_x:.2f} of full-FT fp32; held-out NLL "
            f"{quality[r]['held_out']['nll']:.4f}, best {best_choice} {best['nll']:.4f})")
    else:
        say("fastest at equal quality: none measured")
    return recommendation


def results_page_body(lines: list[str]) -> str:
    """The results page's figures: the report as the run printed it (its fixed-width tables), in a code block."""
    return "```\n" + "\n".join(lines).strip("\n") + "\n```"


def main(argv=None) -> int:
    args = parse_args(argv)
    command = benchmark_command("train_speed", argv)
    import torch

    torch.set_num_threads(1)
    os.environ.setdefault("OMP_NUM_THREADS", "1")

    agentgym_opsd.load_plugins()
    started = time.perf_counter()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    lines: list[str] = []

    def say(text: str = "") -> None:
        print(text, flush=True)
        lines.append(text)

    flags = cpu_flags()
    fast_bf16 = cpu_has_fast_bf16()
    if args.precisions == "auto":
        precisions = ["fp32", "bf16"] if fast_bf16 else ["fp32"]
    else:
        precisions = args.precisions.split(",")
    load_before = load_average()
    say(f"train_speed at {git_commit()}: model {args.model}, torch {torch.__version__}, "
        f"{torch.get_num_threads()} thread "
        f"(OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}), load average before {load_before}")
    say(f"CPU flags: {' '.join(flags) or 'none found'}; native bf16 (amx_bf16 or avx512_bf16): {fast_bf16}; "
        f"precisions measured: {', '.join(precisions)}")
    if "bf16" in precisions and not fast_bf16:
        say("  (bf16 asked for on a CPU without bf16 units: emulated, expect it slower)")
    done = Measurements(args, out, say)
    env_options = {"room": "small", "max_turns": 15, "panel_own_types": True, "expert_searches": True,
                   "panel_size": {"train": 200, "valid_seen": args.held_out + args.val_episodes, "valid_unseen": 1},
                   "progress": False}
    bench = Bench(args)
    progress = "expert episodes" if args.progress else False

    # 1. the rows, and what each choice trains
    data = speed_rows(args, bench, env_options, progress, say)
    rows, window_rows, target, episodes = data["rows"], data["window_rows"], data["target"], data["episodes"]
    tokens, window_tokens = rows.num_tokens, window_rows.num_tokens
    trained = {}
    for choice in args.choices:
        model, _ = bench.fresh(choice)
        trained[choice] = sum(p.numel() for p in model.parameters() if p.requires_grad)
        del model

    # 2. speed: every choice x precision, then the fastest one's variants
    samples = measure_speed(args, bench, data, precisions, done)
    summary = {case: summarize_times(s, tokens) for case, s in samples.items()}
    per_choice = {(c, p): summary[f"{c}/{p}/sft"]["cpu_s_min"] + summary[f"{c}/{p}/rl"]["cpu_s_min"]
                  for p in precisions for c in args.choices}
    fastest, fastest_precision = min(per_choice, key=per_choice.get)
    extra_samples, checks = measure_variants(args, bench, data, fastest, fastest_precision, done)
    extra_summary = {case: summarize_times(s, window_tokens if case.endswith("window") else tokens)
                     for case, s in extra_samples.items()}

    # 3. quality at equal budget, in bf16 when it measured faster
    quality: dict = {}
    quality_precision = None
    if args.quality:
        bf16_time = sum(v for (c, p), v in per_choice.items() if p == "bf16")
        fp32_time = sum(v for (c, p), v in per_choice.items() if p == "fp32")
        bf16_faster = "bf16" in precisions and (fp32_time == 0 or bf16_time < fp32_time)
        quality_precision = "bf16" if bf16_faster else precisions[0]
        quality = measure_quality(args, bench, env_options, quality_precision, done, progress, say)
    load_after = load_average()

    # 4. the report
    table = report_speed(args, summary, extra_summary, checks, trained, tokens, fastest, fastest_precision, say)
    recommendation = None
    if args.quality:
        recommendation = report_quality(args, quality, quality_precision, summary, per_choice, say)
    else:
        say(f"fastest (speed only, --no-quality): {fastest} {fastest_precision}")
    wall = time.perf_counter() - started
    say(f"load average before {load_before}, after {load_after}; wall {wall / 60:.1f} min")

    result = {
        "args": vars(args), "commit": git_commit(), "threads": torch.get_num_threads(), "cpu_flags": flags,
        "native_bf16": fast_bf16, "precisions": precisions, "load_before": load_before, "load_after": load_after,
        "wall_s": wall,
        "rows": {"episodes": len(episodes), "successes": sum(e.success for e in episodes), "rows": rows.num_rows,
                 "tokens": tokens, "generated": int(rows.generated_mask().sum()), "sft_targets": int(target.sum()),
                 "window_rows": window_rows.num_rows, "window_tokens": window_tokens},
        "trained_parameters": trained, "speed": {"summary": table, "samples": samples},
        "fastest": {"choice": fastest, "precision": fastest_precision},
        "variants": {"summary": extra_summary, "samples": extra_samples, "logprob_sums": checks},
        "quality": {"precision": quality_precision, "results": quality, "tolerance": QUALITY_TOLERANCE,
                    "rates": {c: RATES[c] for c in args.choices}} if args.quality else None,
        "recommendation": recommendation,
    }
    atomic_write_json(out / "train_speed.json", result)
    atomic_write_text(out / "train_speed.txt", "\n".join(lines) + "\n")
    plot(summary, precisions, args.choices, out / "train_speed.png")
    print(f"wrote {out / 'train_speed.json'}, .txt and .png")
    if args.page:
        print("results page:", write_results_page(
            "train_speed", "Which weights to train, in which precision: SFT and RL tokens/s, and quality at one budget",
            results_page_body(lines), command=command, threads=1, load=[load_before[0], load_after[0]],
            plots=page_plot(out / "train_speed.png", "train_speed")))
    return 0


def plot(summary: dict, precisions: list[str], choices: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    x = np.arange(len(choices))
    width = 0.8 / len(precisions)
    for ax, what, title in zip(axes, ("sft", "rl"), ("one SFT pass", "one RL update (old log-probs + ppo_update)"),
                               strict=True):
        for i, p in enumerate(precisions):
            values = [summary[f"{c}/{p}/{what}"]["tok_s_min_time"] for c in choices]
            ax.bar(x + (i - (len(precisions) - 1) / 2) * width, values, width, label=p)
        ax.set_xticks(x, choices, rotation=20)
        ax.set(title=title, ylabel="row tokens / CPU s (1 thread)")
        ax.legend()
    fig.tight_layout()
    save_png(fig, path)


if __name__ == "__main__":
    sys.exit(main())
