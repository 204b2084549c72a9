"""What does the teacher cost? The update step of each credit method on one batch, in one run.

The batch has the learning benchmark's shapes (benchmarks/learning.py, the tiny recipe of
trainer/recipes.py): ALFWorld Pick in small rooms, full-chat context, T tasks x G episodes of at most 12
turns, a tiny Qwen3 (hidden 128, 2 layers) on a 1024-token BPE trained on the env's text. The episodes
are the expert's with random detours (so groups mix successes and failures, and failed episodes get a
peer trajectory in their hindsight block); the model's weights do not change what the steps cost.

For each method, an update step is everything the local trainer does after the rollout: token rows,
the old log-probs, the teacher's log-probs (StepOPSD: a stale snapshot with the hindsight block;
AgentOPSD: the live policy with the skill note), the credit, and the clipped policy-gradient update
(`--mini-batches` optimizer steps). The teacher is timed three ways side by side:

    per-turn   StepOPSD: one sequence per (row, turn): the student's prefix, the block, the span;
               AgentOPSD: one sequence per row (the skill note, then the row);
    packed     StepOPSD: each row's turns in one sequence with a block-causal 4-D mask;
               AgentOPSD: as per-turn;
    prefix     StepOPSD: the rows' common prefix once, each row's prefix once on it, their keys and
               values reused by every turn's block and span, batched across rows; AgentOPSD: the
               skill note (the rows' common teacher prefix) once per note, its keys and values reused
               by every row (`trainer.teacher`'s default).

Figures are process CPU seconds (torch on one thread), each phase's minimum over `--repeats` rounds in
which the methods take turns, and the total is the sum of those minima: other jobs on a shared machine
change wall time, much less CPU time, and what they still add (mostly to the update step, the same
work for every method) is not a cost of the method.

    .venv/bin/python -m benchmarks.teacher_speed            # 8 x 8 episodes, 3 rounds
    .venv/bin/python -m benchmarks.teacher_speed --quick    # 4 x 4 episodes, 2 rounds (< 4 minutes)

The last line reads `stepopsd/grpo update X.XX, agentopsd/grpo update Y.YY` (the default teacher).
`--page` also writes the table to docs/benchmarks/teacher_speed.md.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from agentgym_opsd.rollout import EpisodeRequest, run_episodes
from benchmarks.common import (add_page_argument, benchmark_command, load_average, markdown_table, timed,
                               write_results_page)
from trainer.config import TrainConfig
from trainer.local import LocalTrainer
from trainer.recipes import PICK_ENV, PICK_TINY, TINY_QWEN3
from trainer.warm_start import PerturbedExpert

PHASES = ("rows", "old_logprobs", "teacher", "credit", "update", "total")


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=8)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--max-turns", type=int, default=PICK_TINY.max_turns)
    ap.add_argument("--noise", type=float, default=0.4, help="the expert's detour rate (mixed outcomes)")
    ap.add_argument("--mini-batches", type=int, default=PICK_TINY.mini_batches)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="4 tasks x 4 episodes, 2 rounds")
    ap.add_argument("--seed", type=int, default=0)
    add_page_argument(ap)
    return ap.parse_args(argv)


def results_page_body(batch: str, best: dict[tuple[str, str | None], dict[str, float]]) -> str:
    """The results page's figures: the batch (a line), then per (method, teacher) each phase's CPU seconds, the
    total and its ratio to GRPO's (`best` as `main` measures it)."""
    grpo = best[("grpo", None)]["total"]
    table = [[method, teacher or "-", *(f"{t.get(k, 0.0):.2f}" for k in PHASES), f"{t['total'] / grpo:.2f}"]
             for (method, teacher), t in best.items()]
    return batch + "\n\n" + markdown_table(["method", "teacher", "rows", "old log-probs", "teacher", "credit",
                                            "update", "total", "x GRPO"], table)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.quick:
        args.tasks, args.group_size, args.repeats = 4, 4, 2
    import torch

    torch.set_num_threads(1)
    load_before = load_average()
    command = benchmark_command("teacher_speed", argv)  # before anything can change sys.argv (alfworld's code does)

    work = Path(tempfile.mkdtemp(prefix="teacher-speed-"))
    env_options = {"room": "small", "split": "train", "max_turns": args.max_turns,
                   "panel_size": {"train": 200, "valid_seen": 300, "valid_unseen": 10}, "progress": False}
    trainers = {}
    for method in ("grpo", "stepopsd", "agentopsd"):
        config = TrainConfig(env_id=PICK_ENV, out=str(work / method), method=method, **TINY_QWEN3,
                             env_options=env_options, sft_episodes=64, sft_epochs=1, steps=1,
                             mini_batches=args.mini_batches, eval_episodes=0, save_every=0,
                             max_new_tokens=PICK_TINY.max_new_tokens, seed=args.seed, device="cpu", cpu_threads=1)
        run = LocalTrainer(config, progress=False)
        run.start()
        trainers[method] = run
    base = trainers["grpo"]
    for run in trainers.values():  # one policy for every method: same weights, same costs
        run.state.model.load_state_dict(base.state.model.state_dict())
        if run.state.teacher_model is not None:
            run.state.teacher_model.load_state_dict(base.state.model.state_dict())
    expert = PerturbedExpert(args.noise, seed=args.seed)
    requests = [EpisodeRequest(seed=1000 + t, episode_id=f"t{t}-g{i}", group=f"t{t}")
                for t in range(args.tasks) for i in range(args.group_size)]
    episodes = run_episodes(base.make_env, expert, requests, num_envs=len(requests), context="full", progress=False)
    successes = sum(e.success for e in episodes)
    turns = sum(e.num_turns for e in episodes)

    def update_step(method: str, teacher: str | None) -> dict[str, float]:
        run = trainers[method]
        snapshot = {k: v.clone() for k, v in run.state.model.state_dict().items()}
        times: dict[str, float] = {}
        times["rows"], _, rows = timed(lambda: run.rows(episodes))
        times["old_logprobs"], _, old = timed(lambda: run.logprobs(run.state.model, rows))
        scores = None
        if teacher is not None:
            times["teacher"], _, scores = timed(lambda: run.teacher_scores(episodes, rows, strategy=teacher))
        times["credit"], _, (advantages, _, _) = timed(lambda: run.advantages(episodes, rows, old, scores))
        times["update"], _, _ = timed(lambda: run.update(rows, old, advantages, None))
        run.state.model.load_state_dict(snapshot)  # every round starts from the same weights
        times["total"] = sum(times.values())
        return times

    cases = [("grpo", None)] + [(m, s) for m in ("stepopsd", "agentopsd") for s in ("per-turn", "packed", "prefix")]
    best: dict[tuple[str, str | None], dict[str, float]] = {}
    for _ in range(args.repeats):
        for case in cases:
            times = update_step(*case)
            # each phase's minimum over the rounds: a phase's cost is what it takes when nothing else
            # interferes (the update step, the same work for every method, varies most)
            best[case] = {k: min(v, best.get(case, {}).get(k, v)) for k, v in times.items()}
    for times in best.values():
        times["total"] = sum(v for k, v in times.items() if k != "total")
    rows = base.rows(episodes)
    batch = (f"batch: {len(episodes)} episodes ({args.tasks} tasks x {args.group_size}), {turns} turns, {successes} "
             f"successes, {int(rows.attention_mask.sum())} tokens in {rows.num_rows} rows; tiny Qwen3 hidden 128 x 2; "
             f"CPU seconds, 1 thread, min of {args.repeats} rounds")
    print(batch)
    grpo = best[("grpo", None)]["total"]
    header = (f"{'method':<10} {'teacher':<9} {'rows':>6} {'old lp':>7} {'teacher':>8} {'credit':>7} {'update':>7} "
              f"{'total':>7} {'x GRPO':>7}")
    print(header)
    for (method, teacher), t in best.items():
        print(f"{method:<10} {teacher or '-':<9} {t['rows']:>6.2f} {t['old_logprobs']:>7.2f} "
              f"{t.get('teacher', 0.0):>8.2f} "
              f"{t['credit']:>7.2f} {t['update']:>7.2f} {t['total']:>7.2f} {t['total'] / grpo:>7.2f}")
    step = best[("stepopsd", "prefix")]["total"] / grpo
    agent = best[("agentopsd", "prefix")]["total"] / grpo
    print(f"stepopsd/grpo update {step:.2f}, agentopsd/grpo update {agent:.2f}")
    if args.page:
        page = write_results_page(
            "teacher_speed", "What the teacher costs: each credit method's update step on one batch",
            results_page_body(batch, best), command=command, threads=1,
            load=[load_before[0], load_average()[0]])
        print(f"results page: {page}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
