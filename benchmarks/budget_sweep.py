"""Which update budget moves the policy? GRPO's update settings swept from the same warm start, games and
first rollout: KL per update against its rounding floor, clip fraction, and success before -> after.

    .venv/bin/python -m benchmarks.budget_sweep              # 7 settings x 1 update, 4 games x 8 episodes
    .venv/bin/python -m benchmarks.budget_sweep --steps 2    # one more update each (the runs resume)
    .venv/bin/python -m benchmarks.budget_sweep --settings base no-penalty --out runs/budget-sweep-2

Each setting is one `benchmarks.learnability` run, changed from `base` in one thing (`SETTINGS`): the
learning rate, the optimizer steps per update (mini-batches x epochs), the group size, or the invalid-turn
penalty. In a group where every episode fails the success term is constant, so after normalisation the
penalty is the whole advantage: GRPO then learns "fewer invalid turns" and nothing else, which is why it is
swept on and off.

1. The same start for every setting: the warm start `--warm`, `--games` training games drawn with `--seed`,
   rollouts at `--temperature`. The first update's rollout is the same draws in every setting of the same
   group size (same model, games, episode ids and sampling seed): its figures repeat down the table, and
   they must, a check that the settings differ only in the update.
2. `--steps` updates per setting (1: the update each setting makes from that shared rollout). Per update:
   KL(old || new) per token against its floor (the same log-probs through the update's two code paths:
   rounding alone), clip fraction, gradient norm, train success and invalid turns.
3. After: the trained policy replays the first rollout (same draws): success and invalid turns before ->
   after, paired, with a bootstrap interval over games (`learnability.paired_change`). With 4 games x 8
   episodes a single update's success change is within a few episodes of noise: the KL and the invalid
   share are what a sweep this size can rank.
4. `--jobs` settings run at once, each on `--threads` torch threads (2 x 1 on this 2-core machine). A setting
   whose results are there (with as many updates) is read back, not run: the sweep resumes. Writes
   OUT/budget_sweep.txt, .json, .png, and with `--page` docs/benchmarks/budget_sweep.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from tqdm import tqdm

from agentgym_opsd.io import atomic_write_json, atomic_write_text
from benchmarks.common import (REPO, add_page_argument, benchmark_command, git_commit, markdown_table, page_plot,
                               save_png, write_results_page)
from benchmarks.learnability import DEFAULT_WARM

# The base setting is learnability's measured run (runs/learnability: lr 5e-5, 2 x 2 optimizer steps, groups
# of 8, ALFWorld's invalid-turn penalty 0.1, no KL penalty); every other setting changes one thing.
BASE = {"lr": 5e-5, "mini_batches": 2, "ppo_epochs": 2, "group_size": 8, "invalid_coef": 0.1, "kl_coef": 0.0}
SETTINGS: dict[str, tuple[str, dict]] = {
    "base": ("lr 5e-5, 2 mini-batches x 2 epochs, groups of 8, invalid-turn penalty 0.1", {}),
    "lr-1e-5": ("lr 1e-5 (learning.py's rate before this sweep)", {"lr": 1e-5}),
    "lr-2e-4": ("lr 2e-4", {"lr": 2e-4}),
    "one-step": ("1 mini-batch x 1 epoch: one optimizer step per update", {"mini_batches": 1, "ppo_epochs": 1}),
    "eight-steps": ("4 mini-batches x 2 epochs: eight optimizer steps", {"mini_batches": 4}),
    "no-penalty": ("invalid-turn penalty 0: an all-fail group gives no gradient", {"invalid_coef": 0.0}),
    "group-4": ("groups of 4 on the same games (half the episodes)", {"group_size": 4}),
}


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--warm", default=DEFAULT_WARM, help="the warm start's model folder")
    ap.add_argument("--settings", nargs="+", default=list(SETTINGS), help=f"of {', '.join(SETTINGS)}")
    ap.add_argument("--games", type=int, default=4)
    ap.add_argument("--steps", type=int, default=1, help="updates per setting")
    ap.add_argument("--temperature", type=float, default=0.5)
    ap.add_argument("--seed", type=int, default=0, help="picks the games and seeds every setting's run")
    ap.add_argument("--jobs", type=int, default=2, help="settings run at once")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per setting")
    ap.add_argument("--out", default="runs/budget_sweep")
    ap.add_argument("--no-progress", dest="progress", action="store_false")
    add_page_argument(ap)
    args = ap.parse_args(argv)
    unknown = [s for s in args.settings if s not in SETTINGS]
    if unknown:
        ap.error(f"--settings: unknown {', '.join(unknown)}; choose from {', '.join(SETTINGS)}")
    args.settings = list(dict.fromkeys(args.settings))
    for name in ("games", "steps", "jobs", "threads"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} must be >= 1")
    if not 0 < args.temperature <= 2:
        ap.error(f"--temperature must be in (0, 2], got {args.temperature}")
    if not (Path(args.warm) / "config.json").is_file():
        ap.error(f"--warm {args.warm}: no model folder there; make learning's warm start with "
                 "`python -m benchmarks.learning --warm-only` or pass another folder")
    return args


def setting_values(name: str) -> dict:
    """The update settings of `name`: BASE with the setting's one change."""
    return {**BASE, **SETTINGS[name][1]}


def learnability_argv(args, name: str) -> list[str]:
    """The `benchmarks.learnability` command line that runs setting `name` into OUT/name."""
    values = setting_values(name)
    return ["--warm", str(Path(args.warm).resolve()), "--games", str(args.games),
            "--group-size", str(values["group_size"]), "--steps", str(args.steps), "--lr", str(values["lr"]),
            "--mini-batches", str(values["mini_batches"]), "--ppo-epochs", str(values["ppo_epochs"]),
            "--invalid-coef", str(values["invalid_coef"]), "--kl-coef", str(values["kl_coef"]),
            "--temperature", str(args.temperature), "--seed", str(args.seed), "--threads", str(args.threads),
            "--out", str((Path(args.out) / name).resolve()), "--no-progress"]


def finished(args, name: str) -> dict | None:
    """Setting `name`'s results when its run is there with `--steps` updates and the same settings."""
    path = Path(args.out) / name / "learnability.json"
    if not path.is_file():
        return None
    result = json.loads(path.read_text(encoding="utf-8"))
    ran, values = result["args"], setting_values(name)
    same = (ran["steps"] == args.steps and ran["games"] == args.games and ran["seed"] == args.seed
            and ran["temperature"] == args.temperature and ran["group_size"] == values["group_size"]
            and ran["lr"] == values["lr"] and ran["mini_batches"] == values["mini_batches"]
            and ran["ppo_epochs"] == values["ppo_epochs"] and ran["invalid_coef"] == values["invalid_coef"]
            and ran.get("kl_coef", 0.0) == values["kl_coef"])  # runs from before the flag had no KL penalty
    return result if same else None


def run_setting(args, name: str) -> str | None:
    """Run setting `name` (its output to OUT/name/log.txt); None when it worked, else the log's last lines."""
    folder = Path(args.out) / name
    folder.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads)}
    with open(folder / "log.txt", "w", encoding="utf-8") as log:
        done = subprocess.run([sys.executable, "-m", "benchmarks.learnability", *learnability_argv(args, name)],
                              stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env=env)
    if done.returncode == 0 and finished(args, name) is not None:
        return None
    tail = (folder / "log.txt").read_text(encoding="utf-8", errors="replace").strip().splitlines()[-8:]
    return f"exit {done.returncode}: " + "\n    ".join(tail)


def summarise(name: str, result: dict) -> dict:
    """One setting's row: its update settings, the per-update means, and the paired change."""
    updates, change = result["updates"], result["change"]
    values = setting_values(name)
    return {
        "setting": name, "what": SETTINGS[name][0], **values,
        "optimizer_steps": values["mini_batches"] * values["ppo_epochs"],
        "kl": float(np.mean([u["kl_old_new"] for u in updates])),
        "kl_floor": float(np.mean([u.get("kl_floor", float("nan")) for u in updates])),
        "clip_frac": float(np.mean([u["clip_frac"] for u in updates])),
        "grad_norm": float(np.mean([u["grad_norm"] for u in updates])),
        "train_success": [u["train/success"] for u in updates],
        "before": change["before"], "after": change["after"], "difference": change["difference"],
        "interval": change["interval"], "gained": change["gained"], "lost": change["lost"],
        "invalid_before": change.get("invalid_before"), "invalid_after": change.get("invalid_after"),
        "minutes": sum(u["time/step_s"] for u in updates) / 60,  # the updates' own time (a resumed run's too)
    }


def percent(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def table_rows(rows: list[dict]) -> list[list[str]]:
    return [[r["setting"], f"{r['lr']:g}", f"{r['mini_batches']}x{r['ppo_epochs']}", r["group_size"],
             f"{r['invalid_coef']:g}", f"{r['kl']:.2e}", f"{r['kl_floor']:.1e}", f"{r['clip_frac']:.3f}",
             f"{r['grad_norm']:.2f}", " ".join(percent(s) for s in r["train_success"]),
             f"{percent(r['before'])} -> {percent(r['after'])}",
             f"{100 * r['difference']:+.1f} [{100 * r['interval'][0]:+.1f}, {100 * r['interval'][1]:+.1f}]",
             f"{percent(r['invalid_before'])} -> {percent(r['invalid_after'])}", f"{r['minutes']:.1f}"]
            for r in rows]


HEADER = ["setting", "lr", "mini-batches x epochs", "group", "penalty", "KL old->new", "KL floor", "clip fraction",
          "grad norm", "train success per update", "success before -> after", "points [95%]",
          "invalid turns before -> after", "update min"]


def format_text(args, rows: list[dict], load: tuple[float, float], seconds: float) -> str:
    lines = [f"budget_sweep: GRPO from {args.warm}, {args.games} training games (seed {args.seed}), temperature "
             f"{args.temperature}, {args.steps} update(s) per setting, {args.jobs} at a time x {args.threads} "
             f"thread(s) | commit {git_commit()}, load {load[0]:.2f} -> {load[1]:.2f}, {seconds / 60:.1f} min"]
    widths = [max(len(str(c)) for c in col) for col in zip(HEADER, *table_rows(rows))]
    for row in [HEADER, *table_rows(rows)]:
        lines.append("  ".join(str(c).rjust(w) for c, w in zip(row, widths)))
    return "\n".join(lines)


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r["setting"] for r in rows]
    x = np.arange(len(rows))
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4))
    left.bar(x, [max(r["kl"], 1e-12) for r in rows], label="KL(old || new)")
    left.scatter(x, [max(r["kl_floor"], 1e-12) for r in rows], color="k", marker="_", s=300, zorder=3,
                 label="floor (rounding)")
    left.set_yscale("log")
    left.set_xticks(x, names, rotation=30, ha="right")
    left.set(ylabel="KL per token, mean over updates", title="how far an update moves the policy")
    left.legend(fontsize=8)
    diff = np.array([100 * r["difference"] for r in rows])
    low = np.array([100 * r["interval"][0] for r in rows])
    high = np.array([100 * r["interval"][1] for r in rows])
    right.errorbar(x, diff, yerr=[diff - low, high - diff], fmt="o", capsize=4, label="success, points")
    right.scatter(x, [100 * ((r["invalid_after"] or 0) - (r["invalid_before"] or 0)) for r in rows], marker="x",
                  color="C3", zorder=3, label="invalid turns, points")
    right.axhline(0, color="gray", lw=0.8)
    right.set_xticks(x, names, rotation=30, ha="right")
    right.set(ylabel="after - before (same draws)", title="what the updates changed")
    right.legend(fontsize=8)
    fig.tight_layout()
    save_png(fig, path)


def page_body(args, rows: list[dict], text_rows: list[list[str]]) -> str:
    settings = "\n".join(f"- `{r['setting']}`: {r['what']}" for r in rows)
    return (f"GRPO from `{args.warm}` on {args.games} training games of ALFWorld Pick (drawn with seed {args.seed}) "
            f"at temperature {args.temperature}, {args.steps} update(s) per setting, each setting its own "
            f"`benchmarks.learnability` run ({args.jobs} at a time, {args.threads} torch thread(s) each). Every "
            f"setting changes one thing from `base`:\n\n{settings}\n\n{markdown_table(HEADER, text_rows)}\n\n"
            "KL old->new: the mean per-token KL between the rollout's log-probs and the updated policy's, over the "
            "setting's updates; KL floor: the same log-probs through the update's two code paths before any step "
            "(rounding alone). Before -> after: the first update's rollout, then the trained policy on the same "
            "games, episode ids and sampling seed; points: the paired difference with a 95% bootstrap interval "
            "over games. Update min: the setting's updates, rollouts included (not the replay after).")


def main(argv=None) -> int:
    args = parse_args(argv)
    started, load_before = time.perf_counter(), os.getloadavg()[0]
    todo = [name for name in args.settings if finished(args, name) is None]
    failures: dict[str, str] = {}
    if todo:
        print(f"budget_sweep: running {len(todo)} setting(s) ({', '.join(todo)}), {args.jobs} at a time; "
              f"each logs to {args.out}/NAME/log.txt")
        with ThreadPoolExecutor(max_workers=args.jobs) as pool, \
                tqdm(total=len(todo), desc="settings", unit="setting", disable=not args.progress) as bar:
            for name, failure in zip(todo, pool.map(lambda n: run_setting(args, n), todo)):
                bar.update(1)
                if failure:
                    failures[name] = failure
    rows = [summarise(name, result) for name in args.settings if (result := finished(args, name)) is not None]
    seconds = time.perf_counter() - started
    load = (load_before, os.getloadavg()[0])
    out = Path(args.out)
    if rows:
        text = format_text(args, rows, load, seconds)
        print(text)
        atomic_write_text(out / "budget_sweep.txt", text + "\n")
        atomic_write_json(out / "budget_sweep.json", {"args": vars(args), "commit": git_commit(), "rows": rows,
                                                      "seconds": seconds, "load": list(load)})
        plot(rows, out / "budget_sweep.png")
        print(f"wrote {out / 'budget_sweep.txt'}, .json and .png")
        if args.page and not failures:
            page = write_results_page("budget_sweep", "Which update budget moves the policy?",
                                      page_body(args, rows, table_rows(rows)), threads=args.threads,
                                      # read back only: this invocation's load says nothing of the runs
                                      load=[round(x, 2) for x in load] if todo else
                                      "not recorded (every setting read back from an earlier invocation)",
                                      command=benchmark_command("budget_sweep"),
                                      plots=page_plot(out / "budget_sweep.png", "budget_sweep"))
            print(f"wrote {page}")
    for name, failure in failures.items():
        print(f"budget_sweep: setting {name} failed ({failure}); its log: {out / name / 'log.txt'}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
