"""How fast the trainer's sampler rolls out, against the model's own forward passes and the sampler before it.

    .venv/bin/python -m benchmarks.rollout_speed                        # 16 and 32 episodes, 1 thread, 2 rounds
    .venv/bin/python -m benchmarks.rollout_speed --model runs/learning-smollm2-135m/warm0/model
    .venv/bin/python -m benchmarks.rollout_speed --episodes 16 --baseline-commit none   # no old sampler

The rollouts are learning.py's: ALFWorld Pick in small rooms on its 1,000-game training panel, at most 15
turns, a turn capped at 32 tokens, full chat, temperature 1, N/4 games x groups of 4 episodes (fixed
seeds), on `--threads` torch threads (1: what a learning.py run gets beside another). For each N of
`--episodes`, in `--rounds` rounds, each measurement in a fresh process:

1. rollout: `run_episodes` with the trainer's `HFPolicyAgent`; generated tokens (the ids sampled, stop ids
   included) / wall seconds, and where the time went: the model's forwards (prefill: the tokens a turn's
   context added; decode: one token per writing episode per step), the rest of the sampler (sampling,
   stop rules, bookkeeping) and the rest of the rollout (env steps, chat contexts).
2. ceiling: the same forwards (the same ids, rows, positions, copies between slots) replayed back to back
   on a fresh cache with nothing between them: generated tokens / the replay's forward seconds, the most
   this rollout could reach with this model, attention and thread count. `share` = rollout / ceiling.
3. stock forward, for scale: one decode step of N rows at the rollout's mean context through transformers'
   own path (a left-padded `DynamicCache`, SDPA with the padding mask) against the slot forward at the same
   shape; and a [N, 64] forward without a cache (the model's prefill speed, tokens/s).
4. baseline: the same rollout with the sampler of `--baseline-commit` (default 2a4e315, the last before the
   slot cache), its libraries extracted from git into a temporary folder, on the same threads:
   `x baseline` = the speed-up in generated tokens/s (the two samplers draw the same ids up to float
   rounding: tests/trainer/test_sampler_equivalence.py).

Writes OUT/rollout_speed.json and OUT/rollout_speed.txt (default OUT: runs/rollout-speed).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

import agentgym_opsd
from agentgym_opsd.io import atomic_write_json, atomic_write_text
from agentgym_opsd.rollout import EpisodeRequest, run_episodes
from benchmarks.common import REPO, add_page_argument, cpu_model, git_commit, markdown_table, write_results_page
from trainer.models import is_named_model, resolve_model
from trainer.policy import load_policy
from trainer.sampling import HFPolicyAgent

try:  # absent from the baseline's tree, which runs `play` only
    from trainer.slot_cache import SlotCache
except ImportError:
    SlotCache = None

ENV_ID = "agentgym/ALFWorld-Pick-v0"
# learning.py's training env (its default 50-game held-out panel: the same cached games)
ENV_OPTIONS = {"room": "small", "split": "train", "max_turns": 15,
               "panel_size": {"train": 1000, "valid_seen": 0, "valid_unseen": 50}, "panel_own_types": True,
               "expert_searches": True, "progress": False}
GROUP = 4
TURN_TOKENS = 32
LIBRARIES = ("agentgym_opsd", "environments", "retrieval_index", "trainer")


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m", help="smollm2-135m (default) or a model folder")
    ap.add_argument("--episodes", type=int, nargs="+", default=[16, 32], help="rollout sizes (multiples of 4)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1, as a learning.py run)")
    ap.add_argument("--rounds", type=int, default=2, help="interleaved rounds (min and median are reported)")
    ap.add_argument("--seed", type=int, default=0, help="the rollout's seed (games and sampling)")
    ap.add_argument("--baseline-commit", default="2a4e315", help="the sampler to compare with, or none")
    ap.add_argument("--out", default="runs/rollout-speed")
    add_page_argument(ap)
    ap.add_argument("--play", help=argparse.SUPPRESS)  # internal: one measurement in this process, as JSON
    args = ap.parse_args(argv)
    if args.play is None:
        for n in args.episodes:
            if n < GROUP or n % GROUP:
                ap.error(f"--episodes {n}: must be a positive multiple of {GROUP} (games x groups of {GROUP})")
        if args.threads < 1 or args.rounds < 1:
            ap.error("--threads and --rounds must be >= 1")
        if not is_named_model(args.model) and not (Path(args.model) / "config.json").is_file():
            ap.error(f"--model {args.model}: not a named model (smollm2-135m) nor a model folder (no config.json)")
    return args


# ---------------------------------------------------------------------------------------------
# One measurement (in its own process)


class _Recorder:
    """Records every slot-cache forward and copy of a rollout (to replay them) and times the forwards."""

    def __init__(self) -> None:
        self.events: list[tuple] = []
        self.seconds = {"prefill": 0.0, "decode": 0.0}

    def __enter__(self):
        self.forward, self.copy = SlotCache.forward, SlotCache.copy_positions
        recorder = self

        def forward(cache, model, segments, slots, starts, **options):
            t0 = time.perf_counter()
            out = recorder.forward(cache, model, segments, slots, starts, **options)
            kind = "decode" if options.get("every_position") else "prefill"
            recorder.seconds[kind] += time.perf_counter() - t0
            recorder.events.append(("forward", cache.slots, [list(s) for s in segments], list(slots), list(starts),
                                    options))
            return out

        def copy(cache, source, targets, start, end):
            recorder.events.append(("copy", cache.slots, source, list(targets), start, end))
            return recorder.copy(cache, source, targets, start, end)

        SlotCache.forward, SlotCache.copy_positions = forward, copy
        return self

    def __exit__(self, *exc):
        SlotCache.forward, SlotCache.copy_positions = self.forward, self.copy


def replay(model, events) -> dict:
    """The recorded forwards again, on a fresh cache: seconds of the forwards alone."""
    cache = SlotCache(0)
    seconds = {"prefill": 0.0, "decode": 0.0}
    with torch.no_grad():
        for event in events:
            if event[1] > cache.slots:
                cache.add_slots(event[1] - cache.slots)
            if event[0] == "copy":
                cache.copy_positions(*event[2:])
                continue
            _, _, segments, slots, starts, options = event
            t0 = time.perf_counter()
            SlotCache.forward(cache, model, segments, slots, starts, **options)
            seconds["decode" if options.get("every_position") else "prefill"] += time.perf_counter() - t0
    return seconds


def stock_step(model, rows: int, context: int, repeats: int = 5) -> dict:
    """ms of one decode step of `rows` rows at `context` keys: transformers' DynamicCache path and the slot
    path; and tokens/s of a [rows, 64] forward without a cache."""
    from transformers import DynamicCache

    config = model.config
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    layers = config.num_hidden_layers
    gen = torch.Generator().manual_seed(0)
    kv = [(torch.randn(rows, kv_heads, context, dim, generator=gen), torch.randn(rows, kv_heads, context, dim,
                                                                                   generator=gen))
          for _ in range(layers)]
    token = torch.full((rows, 1), 100, dtype=torch.long)
    out = {}
    with torch.no_grad():
        times = []
        for _ in range(repeats):
            cache = DynamicCache(ddp_cache_data=[(k.clone(), v.clone()) for k, v in kv], config=config)
            mask = torch.ones(rows, context + 1, dtype=torch.long)
            t0 = time.perf_counter()
            model(input_ids=token, attention_mask=mask, position_ids=torch.full((rows, 1), context),
                  past_key_values=cache, use_cache=True, logits_to_keep=1)
            times.append(time.perf_counter() - t0)
        out["stock_step_ms"] = 1000 * min(times)
        slots = SlotCache(rows, context + 64)
        slots.begin(list(range(rows)), [0] * rows, [1] * rows)
        for layer, (k, v) in enumerate(kv):  # allocate the buffers, then fill them
            slots.update(torch.zeros(1, kv_heads, rows, dim), torch.zeros(1, kv_heads, rows, dim), layer)
            slots.keys[layer][:, :, :context] = k
            slots.values[layer][:, :, :context] = v
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            slots.forward(model, [[100]] * rows, list(range(rows)), [context] * rows)
            times.append(time.perf_counter() - t0)
        out["slot_step_ms"] = 1000 * min(times)
        ids = torch.randint(1000, 20000, (rows, 64), generator=gen)
        times = []
        for _ in range(max(2, repeats // 2)):
            t0 = time.perf_counter()
            model(input_ids=ids, use_cache=False, logits_to_keep=1)
            times.append(time.perf_counter() - t0)
        out["prefill_tokens_per_s"] = rows * 64 / min(times)
    return out


def play(model_path: str, episodes: int, seed: int, threads: int, ceiling: bool) -> dict:
    """One rollout of `episodes` episodes (and, with the slot sampler and `ceiling`, its replay)."""
    torch.set_num_threads(threads)
    agentgym_opsd.load_plugins()
    model, tokenizer = load_policy(model_path, device="cpu", dtype="float32")
    model.eval()
    env_seconds = [0.0]

    def make_env():
        env = agentgym_opsd.make(ENV_ID, **ENV_OPTIONS)
        step = env.step

        def timed_step(action):
            t0 = time.perf_counter()
            try:
                return step(action)
            finally:
                env_seconds[0] += time.perf_counter() - t0

        env.step = timed_step
        return env

    rng = torch.Generator().manual_seed(seed)
    games = torch.randint(0, 2**31 - 1, (episodes // GROUP,), generator=rng).tolist()
    requests = [EpisodeRequest(seed=g, episode_id=f"t{j}-g{i}", group=f"t{j}")
                for j, g in enumerate(games) for i in range(GROUP)]
    agent = HFPolicyAgent(model, tokenizer, max_new_tokens=TURN_TOKENS, temperature=1.0, seed=seed)
    recorder = _Recorder() if SlotCache is not None else None
    t0, cpu0 = time.perf_counter(), time.process_time()
    if recorder is not None:
        with recorder:
            played = run_episodes(make_env, agent, requests, num_envs=episodes, context="full", progress=False)
    else:
        played = run_episodes(make_env, agent, requests, num_envs=episodes, context="full", progress=False)
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    stats = agent.pop_stats()
    agent.annotate(played)
    contexts = [sum(len(t.tokens.prompt_ids) + len(t.tokens.sampled_ids) for t in e.turns[: k + 1])
                for e in played for k in range(e.num_turns) if e.turns[k].tokens is not None]
    result = {
        "wall_s": wall, "new_tokens": stats["new_tokens"], "tokens_per_s": stats["new_tokens"] / wall,
        "cpu_s": cpu, "tokens_per_cpu_s": stats["new_tokens"] / cpu,
        "sampler_s": stats["seconds"], "env_s": env_seconds[0], "turns": sum(e.num_turns for e in played),
        "successes": sum(e.success for e in played), "prefill_tokens": stats["prefill_tokens"],
        "capped_turns": stats["capped_turns"], "mean_context": statistics.mean(contexts) if contexts else 0.0,
    }
    if recorder is not None:
        result["forward_s"] = dict(recorder.seconds)
        result["decode_rows"] = stats.get("decode_rows")
        if ceiling:
            result["replay_s"] = replay(model, recorder.events)
            result.update(stock_step(model, episodes, int(result["mean_context"])))
    return result


# ---------------------------------------------------------------------------------------------
# The parent: rounds of measurements, each in a fresh process, and the table


def extract(commit: str, into: Path) -> Path:
    """The project's libraries at `commit`, from git, in `into`."""
    archive = subprocess.run(["git", "-C", str(REPO), "archive", commit, *LIBRARIES], capture_output=True, check=False)
    if archive.returncode != 0:
        raise SystemExit(f"rollout_speed: cannot read commit {commit!r} from git ({archive.stderr.decode().strip()}); "
                         "pass --baseline-commit none to measure the current sampler only")
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into


def measure(args, episodes: int, tree: Path | None, ceiling: bool) -> dict:
    """One `play` in a fresh process: on this checkout, or on the libraries extracted in `tree`."""
    spec = json.dumps({"model": str(args.model_path), "episodes": episodes, "seed": args.seed,
                       "threads": args.threads, "ceiling": ceiling})
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS=str(args.threads))
    command = [sys.executable, "-m", "benchmarks.rollout_speed", "--play", spec]
    done = subprocess.run(command, cwd=str(tree or REPO), env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        which = f"the baseline {args.baseline_commit}" if tree else "this checkout"
        raise SystemExit(f"rollout_speed: a measurement failed ({which}, {episodes} episodes):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def summarize(runs: list[dict], baseline: list[dict]) -> dict:
    def mid(values):
        return {"min": min(values), "median": statistics.median(values)}

    out = {"rollout_tokens_per_s": mid([r["tokens_per_s"] for r in runs]),
           "rollout_tokens_per_cpu_s": mid([r["tokens_per_cpu_s"] for r in runs]),
           "ceiling_tokens_per_s": mid([r["new_tokens"] / sum(r["replay_s"].values()) for r in runs]),
           "share": mid([sum(r["replay_s"].values()) / r["wall_s"] for r in runs]),
           "stock_step_ms": mid([r["stock_step_ms"] for r in runs]),
           "slot_step_ms": mid([r["slot_step_ms"] for r in runs]),
           "prefill_tokens_per_s": mid([r["prefill_tokens_per_s"] for r in runs])}
    if baseline:
        out["baseline_tokens_per_s"] = mid([r["tokens_per_s"] for r in baseline])
        out["speedup"] = mid([a["tokens_per_s"] / b["tokens_per_s"] for a, b in zip(runs, baseline, strict=True)])
        if all("tokens_per_cpu_s" in r for r in baseline):  # the baseline's tree has this script's `play`
            out["cpu_speedup"] = mid([a["tokens_per_cpu_s"] / b["tokens_per_cpu_s"]
                                      for a, b in zip(runs, baseline, strict=True)])
    return out


def page_body(args, results: dict, minutes: float) -> str:
    """The results page's figures: one row per rollout size (medians over rounds), and what they mean."""
    rows = []
    for n, entry in results.items():
        s = entry["summary"]
        base = s.get("baseline_tokens_per_s", {}).get("median")
        rows.append([n, f"{s['rollout_tokens_per_s']['median']:.1f}", f"{s['rollout_tokens_per_cpu_s']['median']:.1f}",
                     f"{s['ceiling_tokens_per_s']['median']:.1f}", f"{100 * s['share']['median']:.0f}%",
                     "-" if base is None else f"{base:.1f}",
                     "-" if base is None else f"{s['speedup']['median']:.2f}",
                     f"{s['cpu_speedup']['median']:.2f}" if "cpu_speedup" in s else "-",
                     f"{s['stock_step_ms']['median']:.0f} / {s['slot_step_ms']['median']:.0f}"])
    table = markdown_table(["episodes", "rollout tok/s", "tok per CPU s", "ceiling tok/s", "share", "baseline tok/s",
                            "x baseline", "x baseline (CPU s)", "decode step ms: stock / slot"], rows)
    return (f"{ENV_ID} (learning.py's training env), {args.model}, {args.rounds} round(s), "
            f"{minutes:.1f} min.\n\n{table}\n\n"
            "tok/s: generated tokens (the ids sampled) per wall second of the rollout; tok per CPU s: per second "
            "of the process's CPU time (steadier than wall time on a shared machine). ceiling: the rollout's own "
            "forwards replayed back to back with nothing between them; share = the time in those forwards over "
            "the rollout's wall time. x baseline: against the sampler of "
            f"{args.baseline_commit}, same episodes, seeds and threads, each rollout in a fresh process. "
            "decode step: one step of all rows at the mean context, transformers' DynamicCache path against the "
            "slot cache.")


def format_table(args, results: dict, load: tuple[float, float], minutes: float) -> str:
    cpu = cpu_model()
    lines = [f"rollout speed, {ENV_ID} (learning.py's env), {args.model}, {args.threads} thread(s), {cpu}, "
             f"commit {git_commit()}, load average {load[0]:.1f} -> {load[1]:.1f}, {minutes:.1f} min",
             f"{'episodes':>8} {'rollout tok/s':>14} {'ceiling tok/s':>14} {'share':>6} {'baseline tok/s':>15} "
             f"{'x baseline':>10} {'step ms: stock':>15} {'slot':>6} {'prefill tok/s':>14}"]
    for n, entry in results.items():
        s = entry["summary"]
        base = s.get("baseline_tokens_per_s", {}).get("median")
        base_text = "-" if base is None else f"{base:.1f}"
        speedup_text = "-" if base is None else f"{s['speedup']['median']:.2f}"
        lines.append(f"{n:>8} {s['rollout_tokens_per_s']['median']:>14.1f} "
                     f"{s['ceiling_tokens_per_s']['median']:>14.1f} "
                     f"{100 * s['share']['median']:>5.0f}% {base_text:>15} {speedup_text:>10} "
                     f"{s['stock_step_ms']['median']:>15.0f} {s['slot_step_ms']['median']:>6.0f} "
                     f"{s['prefill_tokens_per_s']['median']:>14.0f}")
        for r in entry["runs"]:
            forward = sum(r["forward_s"].values())
            lines.append(f"{'':>8} round: {r['wall_s']:.1f} s ({r['cpu_s']:.1f} CPU s), {r['new_tokens']} tokens, "
                         f"{r['turns']} turns "
                         f"({r['capped_turns']} capped), mean context {r['mean_context']:.0f}; forwards "
                         f"{forward:.1f} s (prefill {r['forward_s']['prefill']:.1f}, decode "
                         f"{r['forward_s']['decode']:.1f}), rest of the sampler {r['sampler_s'] - forward:.1f} s, "
                         f"envs {r['env_s']:.1f} s; replay {sum(r['replay_s'].values()):.1f} s")
        for r in entry["baseline"]:
            lines.append(f"{'':>8} baseline round: {r['wall_s']:.1f} s ({r.get('cpu_s', float('nan')):.1f} CPU s), "
                         f"{r['new_tokens']} tokens, {r['turns']} turns")
    lines.append("tok/s: generated tokens per wall second (medians over rounds). ceiling: the rollout's own forwards "
                 "replayed back to back; share = rollout time in those forwards. step ms: one decode step of all "
                 "rows at the mean context, transformers' DynamicCache path vs the slot cache. x baseline: against "
                 f"the sampler of {args.baseline_commit}, same episodes, seeds and threads, each rollout in a fresh "
                 "process.")
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.play is not None:
        spec = json.loads(args.play)
        print(json.dumps(play(spec["model"], spec["episodes"], spec["seed"], spec["threads"], spec["ceiling"])))
        return 0
    args.model_path = resolve_model(args.model).resolve()  # the baseline runs from its own folder
    out = Path(args.out)
    started, load_before = time.perf_counter(), os.getloadavg()[0]
    results: dict = {}
    with tempfile.TemporaryDirectory(prefix="rollout-baseline-") as tmp:
        tree = extract(args.baseline_commit, Path(tmp)) if args.baseline_commit != "none" else None
        for n in args.episodes:
            runs, baseline = [], []
            for r in range(args.rounds):
                order = [False, True] if r % 2 == 0 else [True, False]  # which sampler goes first alternates
                for old in order:
                    if old and tree is None:
                        continue
                    print(f"{n} episodes, round {r + 1}: {'baseline' if old else 'slot sampler'}", flush=True)
                    (baseline if old else runs).append(measure(args, n, tree if old else None, ceiling=not old))
            results[n] = {"runs": runs, "baseline": baseline, "summary": summarize(runs, baseline)}
    load, minutes = (load_before, os.getloadavg()[0]), (time.perf_counter() - started) / 60
    table = format_table(args, results, load, minutes)
    print(table)
    if args.page:
        page = write_results_page("rollout_speed", "How fast the trainer's sampler rolls out",
                                  page_body(args, results, minutes), threads=args.threads, load=load,
                                  command="python -m benchmarks.rollout_speed " + " ".join(sys.argv[1:]))
        print(f"wrote {page}")
    atomic_write_text(out / "rollout_speed.txt", table + "\n")
    atomic_write_json(out / "rollout_speed.json", {"args": {k: str(v) for k, v in vars(args).items()},
                                                   "commit": git_commit(), "results": results})
    print(f"wrote {out / 'rollout_speed.txt'} and {out / 'rollout_speed.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
