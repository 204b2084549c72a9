"""WebShop's expert (and the random agent) over every goal of a catalog, with the reason for each miss.

For each goal the expert searches, opens the target, chooses the option values that score best, and
buys. A goal it does not solve (reward < 1) is explained: the target was not found by its queries,
or the target cannot reach 1.0 under WebShop's reward (with, for each goal option that no option
value of the target matches, the texts the reward compares and their token-set score).

    .venv/bin/python -m benchmarks.webshop_expert                     # ../shared/data/webshop, all goals
    .venv/bin/python -m benchmarks.webshop_expert --catalog builtin --split test

Prints success rate, mean score and mean turns of the expert and the random agent, then one line
per failed goal; `--json PATH` also writes them, `--page` writes them to docs/benchmarks/webshop_expert.md.

Then the type tagger line: the built-in noun tagger against spaCy's model (WebShop's own tagger) on
every goal x every product of the catalog (options: each group's first value; the catalog's price):
how often r_type and the total reward are equal, overall and on the target purchases. spaCy's
`en_core_web_sm` is not on PyPI: pass `--spacy-model NAME_OR_FOLDER` (an installed model package or
an unpacked model folder); without one the line says it was skipped.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from collections import Counter
from pathlib import Path

from tqdm.auto import tqdm

import agentgym_opsd
from agentgym_opsd import EnvUnavailable
from agentgym_opsd.agents import ExpertAgent, RandomAgent
from agentgym_opsd.io import atomic_write_json
from agentgym_opsd.rollout import EpisodeRequest, run_episodes
from benchmarks.common import (SHARED_DATA, add_page_argument, benchmark_command, load_average, markdown_table,
                               write_results_page)
from environments.webshop.reward import (
    MATCH_THRESHOLD,
    builtin_nouns,
    fuzz_text,
    normalize_color,
    noun_tagger,
    token_set_score,
    webshop_reward,
)

DEFAULT_CATALOG = SHARED_DATA / "webshop"


def _shown(value) -> str:
    return " ".join(fuzz_text(value).split())


def explain_option(goal_option, target_values: list[str]) -> str:
    """Why no option value of the target matches one goal option under WebShop's option reward."""
    wanted = normalize_color(goal_option)
    label = f"{goal_option[0]}: {goal_option[1]}" if isinstance(goal_option, tuple) else goal_option
    if not target_values:
        return f"goal option {label!r}: the target has no option values"
    value = goal_option[1] if isinstance(goal_option, tuple) else goal_option
    parts = [f"goal option {label!r} is compared as {_shown(wanted)!r}"]
    if value in target_values:
        own = token_set_score(normalize_color(value), wanted)
        parts.append(f"choosing {value!r} itself gives {_shown(normalize_color(value))!r}: score {own}")
    best = max(target_values, key=lambda v: token_set_score(normalize_color(v), wanted))
    score = token_set_score(normalize_color(best), wanted)
    parts.append(
        f"best of the target's values: {best!r} -> {_shown(normalize_color(best))!r}, score {score} (needs > "
        f"{MATCH_THRESHOLD})")
    return "; ".join(parts)


def tagger_agreement(world, spacy_model: str) -> dict:
    """The built-in noun tagger against spaCy's model: equal r_type and equal total reward over every
    goal x product pair of the world's catalog (printed, and returned with the counts)."""
    try:
        spacy_nouns = noun_tagger(f"spacy:{spacy_model}")
    except EnvUnavailable as e:
        line = f"type tagger vs spaCy: skipped ({e})"
        print(line)
        return {"line": line}
    catalog = world.catalog
    counts = {"pairs": 0, "r_type_equal": 0, "total_equal": 0, "targets": 0, "targets_equal": 0}
    for goal in tqdm(world.goals, desc="tagger agreement", unit="goal", leave=False):
        for product in catalog.products:
            options = {k: v[0] for k, v in product.options.items() if v}
            price = catalog.price(product.asin)
            ours = webshop_reward(product, goal, price, options, builtin_nouns)
            theirs = webshop_reward(product, goal, price, options, spacy_nouns)
            counts["pairs"] += 1
            counts["r_type_equal"] += ours.r_type == theirs.r_type
            counts["total_equal"] += ours.reward == theirs.reward
            if product.asin == goal.asin:
                counts["targets"] += 1
                counts["targets_equal"] += ours.reward == theirs.reward
    n = counts["pairs"]
    line = (
        f"type tagger vs spaCy ({spacy_model}): {len(world.goals)} goals x {len(catalog)} products = {n} pairs: "
        f"r_type equal {counts['r_type_equal'] / n:.2%}, total reward equal {counts['total_equal'] / n:.2%} "
        f"({n - counts['total_equal']} differ); target purchases {counts['targets_equal']}/{counts['targets']}"
    )
    print(line)
    return {"line": line, **counts}


def explain_failures(expert_episodes, world) -> list[dict]:
    """Each goal the expert did not solve: its task id, score, target and the reasons (the target not found by
    its queries, or what keeps the target below 1.0 under WebShop's reward)."""
    failures = []
    for episode in tqdm(expert_episodes, desc="explaining misses", disable=True):
        if episode.hindsight.success:
            continue
        details = episode.hindsight.details
        goal = world.goals[details["goal_index"]]
        target = world.catalog.by_asin[goal.asin]
        purchased = details["purchased"] or {}
        reasons = []
        if purchased.get("asin") != goal.asin:
            reasons.append(
                f"the target {goal.asin} was not found by the expert's queries (bought {purchased.get('asin')})")
        else:
            info = details["reward_info"]
            wanted = list(goal.goal_options.items()) if isinstance(goal.goal_options, dict) else list(goal.goal_options)
            values = [v for vs in target.options.values() for v in vs]
            for g in wanted:
                label = f"{g[0]}: {g[1]}" if isinstance(g, tuple) else g
                if label in info["missed_options"]:
                    reasons.append(explain_option(g, values))
            for a in info["missed_attributes"]:
                reasons.append(f"goal attribute {a!r} is in neither the target's attributes (fuzzy) nor its texts")
            if not info["r_price"]:
                reasons.append(f"price {info['price']:.2f} above the bound {goal.price_upper:.2f}")
            if info["r_type"] < 1:
                reasons.append(f"type reward {info['r_type']}")
        failures.append({"task_id": episode.task_id, "score": episode.hindsight.score, "asin": goal.asin,
                         "reasons": reasons})
    return failures


def results_page_body(figures: dict, causes: dict[str, int], tagger_line: str, shown: int = 50) -> str:
    """The results page's figures: each agent's success, mean score and turns, the expert's misses by cause and
    the first `shown` of them with their reasons, and the type tagger's line (`figures` as --json writes it)."""
    agents = [[name, f["goals"], f"{f['success']:.4f}", f"{f['mean_score']:.4f}", f"{f['mean_turns']:.2f}"]
              for name, f in figures.items() if name not in ("expert_failures", "tagger")]
    failures = figures["expert_failures"]
    misses = [[f["task_id"], f"{f['score']:.3f}", f["asin"], "; ".join(f["reasons"])] for f in failures[:shown]]
    more = f"\n\n... and {len(failures) - shown} more (`--json` writes them all)." if len(failures) > shown else ""
    return (markdown_table(["agent", "goals", "success", "mean score", "mean turns"], agents)
            + f"\n\nThe expert's misses: {len(failures)}, by cause: "
            + (", ".join(f"{kind} {count}" for kind, count in causes.items()) or "none")
            + ("\n\n" + markdown_table(["task", "score", "target", "why"], misses) + more if misses else "")
            + f"\n\n{tagger_line}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--catalog", default=str(DEFAULT_CATALOG) if DEFAULT_CATALOG.exists() else "builtin")
    parser.add_argument("--split", default="all", choices=["test", "eval", "train", "all"])
    parser.add_argument("--index-dir", default=None, help="index folder (default: a temporary one, built here)")
    parser.add_argument("--json", default=None, help="also write the figures and failures to this JSON file")
    parser.add_argument("--spacy-model", default="en_core_web_sm",
                        help="spaCy model package or folder for the tagger line")
    parser.add_argument("--no-agents", action="store_true", help="only the tagger line")
    add_page_argument(parser)
    args = parser.parse_args(argv)
    load_before = load_average()
    command = benchmark_command("webshop_expert", argv)  # before anything can change sys.argv (alfworld's code does)

    index_dir = args.index_dir or str(Path(tempfile.mkdtemp(prefix="webshop-expert-")) / "index")
    catalog = None if args.catalog == "builtin" else args.catalog

    def make():
        return agentgym_opsd.make("agentgym/WebShop-v0", catalog=catalog, index_dir=index_dir, split=args.split)

    probe = make().unwrapped
    n = probe.num_tasks
    requests = [EpisodeRequest(seed=i) for i in range(n)]
    results = {}
    tagger = tagger_agreement(probe.world, args.spacy_model)
    if args.no_agents:
        return 0
    for name, agent in (("expert", ExpertAgent()), ("random", RandomAgent(0))):
        episodes = run_episodes(make, agent, requests, num_envs=8, progress=f"{name} on {n} goals")
        results[name] = episodes
        scores = [e.hindsight.score for e in episodes]
        print(
            f"{name:<7} goals {n}  success {sum(e.hindsight.success for e in episodes) / n:.4f}  "
            f"mean score {statistics.fmean(scores):.4f}  mean turns "
            f"{statistics.fmean(e.num_turns for e in episodes):.2f}"
        )

    failures = explain_failures(results["expert"], probe.world)
    print(f"\nexpert misses: {len(failures)}")
    for f in failures:
        print(f"  {f['task_id']}  score {f['score']:.3f}  {f['asin']}: " + " | ".join(f["reasons"]))
    kinds = Counter("not found" if "not found" in " ".join(f["reasons"]) else "unattainable on the target"
                    for f in failures)
    print(f"by cause: {dict(kinds)}")
    print(tagger["line"])
    figures = {name: {"goals": n, "success": sum(e.hindsight.success for e in eps) / n,
                      "mean_score": statistics.fmean(e.hindsight.score for e in eps),
                      "mean_turns": statistics.fmean(e.num_turns for e in eps)}
               for name, eps in results.items()} | {"expert_failures": failures, "tagger": tagger}
    if args.json:
        atomic_write_json(args.json, figures)
    if args.page:
        page = write_results_page(
            "webshop_expert", "WebShop's expert and the random agent over every goal of a catalog, with each miss",
            results_page_body(figures, dict(kinds), tagger["line"]),
            command=command,
            load=[load_before[0], load_average()[0]])
        print(f"results page: {page}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
