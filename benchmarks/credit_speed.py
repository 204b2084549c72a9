"""How fast is the credit core? Every method next to GRPO on one synthetic batch, in one run.

The batch: 512 episodes x 20 turns x 128 generated tokens per turn (1.31M generated tokens), groups of
8, random outcomes, step rewards and state keys drawn from a small set (so GiGPO clusters), random
student and teacher log-probs. Two row layouts:
    full   one row per episode: a 64-token prompt, then per turn 128 generated tokens (the last 24
           are the action block, StepOPSD's `action_only` span) and a 32-token observation;
    window one row per turn: a 256-token prompt and the turn's 128 generated tokens.
Each method's `compute_advantages` (validation and diagnostics included: the real call) is timed over
several runs after a warm-up, the methods taking turns within each round; the table shows the fastest run (the
least disturbed by other jobs on a shared machine), the median, and the median process CPU time. Targets (issue 4):
under 50 ms per 100k generated tokens, and no method over 20x GRPO's time.

    .venv/bin/python -m benchmarks.credit_speed [--episodes 512] [--turns 20] [--tokens 128] [--repeats 7] [--threads N]
        [--page]

`--page` also writes the figures to docs/benchmarks/credit_speed.md.

On a shared, oversubscribed machine `--threads 1` gives the steadiest figures (min ~ median, CPU ~
wall): torch's two intra-op threads then wait on each other while other jobs hold the cores.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

import torch

from benchmarks.common import add_page_argument, benchmark_command, load_average, markdown_table, write_results_page
from trainer.credit import CreditBatch, CreditConfig, compute_advantages

METHODS = ["grpo", "gigpo", "stepopsd", "agentopsd", "rlsd"]


def make_batch(episodes: int, turns: int, tokens: int, layout: str, group_size: int = 8, seed: int = 0) -> CreditBatch:
    g = torch.Generator().manual_seed(seed)
    E, K, L = episodes, turns, tokens
    action = min(24, L)
    if layout == "full":
        prompt, obs = 64, 32
        T = prompt + K * (L + obs)
        turn_id = torch.full((E, T), -1, dtype=torch.long)
        span = torch.zeros(E, T, dtype=torch.bool)
        for k in range(K):  # building the synthetic layout, not part of the timed credit math
            start = prompt + k * (L + obs)
            turn_id[:, start : start + L] = k
            span[:, start + L - action : start + L] = True
        row_episode = torch.arange(E)
    elif layout == "window":
        prompt = 256
        T = prompt + L
        R = E * K
        turn_id = torch.full((R, T), -1, dtype=torch.long)
        turn_id[:, prompt:] = torch.arange(K).repeat(E).unsqueeze(1)
        span = torch.zeros(R, T, dtype=torch.bool)
        span[:, T - action :] = True
        row_episode = torch.arange(E).repeat_interleave(K)
    else:
        raise ValueError(layout)
    R = turn_id.shape[0]
    student = -torch.rand(R, T, generator=g) * 3.0
    teacher = student + torch.randn(R, T, generator=g)
    return CreditBatch(
        turn_id=turn_id,
        span=span,
        row_episode=row_episode,
        episode_group=torch.arange(E) // group_size,
        success=torch.rand(E, generator=g) < 0.4,
        num_turns=torch.full((E,), K, dtype=torch.long),
        score=torch.rand(E, generator=g),
        invalid_turns=torch.randint(0, 3, (E,), generator=g),
        step_reward=(torch.rand(E, K, generator=g) < 0.1).to(torch.float32),
        state_id=torch.randint(0, 30, (E, K), generator=g),
        student_logprobs=student,
        teacher_logprobs=teacher,
    )


def time_methods(batch: CreditBatch, methods: list[str], repeats: int) -> dict[str, tuple[float, float, float]]:
    """{method: (min wall, median wall, median process CPU)} seconds of one `compute_advantages` call.

    The methods take turns within each repeat (round robin), so that a burst of load from other
    jobs on a shared machine hits them all alike and the ratios to GRPO stay fair.
    """
    configs = {
        m: CreditConfig(method=m, span_mode="clean_step" if m in ("agentopsd", "rlsd") else "action_only")
        for m in methods
    }
    for config in configs.values():
        compute_advantages(batch, config, step=3)  # warm-up
    wall: dict[str, list[float]] = {m: [] for m in methods}
    cpu: dict[str, list[float]] = {m: [] for m in methods}
    for _ in range(repeats):
        for m in methods:
            t0, c0 = time.perf_counter(), time.process_time()
            compute_advantages(batch, configs[m], step=3)
            wall[m].append(time.perf_counter() - t0)
            cpu[m].append(time.process_time() - c0)
    return {m: (min(wall[m]), statistics.median(wall[m]), statistics.median(cpu[m])) for m in methods}


def results_page_body(episodes: int, turns: int, tokens: int,
                      layouts: dict[str, tuple[int, int, dict[str, tuple[float, float, float]]]]) -> str:
    """The results page's figures: per layout, {layout: (rows, columns, time_methods' timings)}, a table of
    each method's min / median / CPU ms, ms per 100k generated tokens and ratio to GRPO (from the min)."""
    generated = episodes * turns * tokens
    parts = [f"{episodes} episodes x {turns} turns x {tokens} generated tokens per turn = {generated:,} "
             "generated tokens. ms/100k and x GRPO from the fastest run; targets: under 50 ms per 100k "
             "generated tokens, at most 20x GRPO."]
    for layout, (rows, cols, timings) in layouts.items():
        base = timings["grpo"][0]
        table = []
        for method, (best, median, cpu) in timings.items():
            per_100k = best * 1e3 / (generated / 1e5)
            table.append([method, f"{best * 1e3:.1f}", f"{median * 1e3:.1f}", f"{cpu * 1e3:.1f}", f"{per_100k:.2f}",
                          f"{best / base:.2f}", "ok" if per_100k < 50 and best / base <= 20 else "MISS"])
        parts.append(f"## Layout `{layout}`: batch [{rows} x {cols}] = {rows * cols:,} tokens\n\n" + markdown_table(
            ["method", "min ms", "median ms", "CPU ms", "ms/100k generated", "x GRPO", "target"], table))
    return "\n\n".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--episodes", type=int, default=512)
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--tokens", type=int, default=128, help="generated tokens per turn")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--layouts", default="full,window")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    add_page_argument(parser)
    args = parser.parse_args()
    load_before = load_average()
    command = benchmark_command("credit_speed")  # before anything can change sys.argv (alfworld's code does)
    if args.threads:
        torch.set_num_threads(args.threads)

    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} CPUs, "
        f"{platform.processor() or platform.machine()}")
    generated = args.episodes * args.turns * args.tokens
    measured = {}
    for layout in args.layouts.split(","):
        batch = make_batch(args.episodes, args.turns, args.tokens, layout)
        R, T = batch.turn_id.shape
        print(
            f"\nlayout {layout}: {args.episodes} episodes x {args.turns} turns x {args.tokens} tokens/turn"
            f" = {generated:,} generated tokens; batch [{R} x {T}] = {R * T:,} tokens"
        )
        print(
            f"{'method':<10} {'min ms':>8} {'median ms':>10} {'cpu ms':>8} {'ms/100k gen':>12} {'x GRPO':>7}"
            "  (ms/100k and x GRPO from the min; target <50 ms/100k, <=20x)"
        )
        timings = time_methods(batch, METHODS, args.repeats)
        measured[layout] = (R, T, timings)
        base = timings["grpo"][0]
        for method in METHODS:
            best, median, cpu = timings[method]
            per_100k = best * 1e3 / (generated / 1e5)
            ok = "ok" if per_100k < 50 and best / base <= 20 else "MISS"
            print(
                f"{method:<10} {best * 1e3:>8.1f} {median * 1e3:>10.1f} {cpu * 1e3:>8.1f} {per_100k:>12.2f}"
                f" {best / base:>7.2f}  {ok}"
            )
    print(f"\nload average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())} (other jobs share these CPUs)")
    if args.page:
        page = write_results_page(
            "credit_speed", "How fast the credit core is: each method's compute_advantages on one synthetic batch",
            results_page_body(args.episodes, args.turns, args.tokens, measured),
            command=command, threads=torch.get_num_threads(),
            load=[load_before[0], load_average()[0]])
        print(f"results page: {page}")


if __name__ == "__main__":
    main()
