"""Does per-turn credit land on the turns that mattered? Every method's credit against the env's oracle.

    .venv/bin/python benchmarks/credit_quality.py                 # ALFWorld Pick, small rooms, literate warm start
    .venv/bin/python benchmarks/credit_quality.py --warm-start plain
    .venv/bin/python benchmarks/credit_quality.py --train-games 200  # the learning benchmark's 200 games


1. A warm start (cached under OUT/warmstart-<kind>-<N>games): a tiny Qwen3 fine-tuned on the env's
   expert with random detours, as the learning benchmark does, on `--train-games` Pick games (1,000 by
   default: on 200 a tiny model memorises the games, benchmarks/warm_start.py, and the scored
   episodes below are played on them). `--warm-start plain` imitates the expert's turns
   only; `literate` also teaches the model the privileged contexts its teacher will read (the
   hindsight block before an action, with the expert's correction as the target after a detour;
   AgentOPSD's skill note), on a share of the episodes (`--literate-share`).
2. Episodes: G per task of the expert with random detours at rate `--detour` (good and bad turns both
   plentiful), with the env's privileged turn labels on (`turn_labels=True`: progress = the expert's
   remaining plan got shorter); `--policy-episodes N` adds the warm-started policy's own rollouts.
3. For each method, the credit an update would give (one pass: rows, the student's log-probs, the
   teacher with privileged context, `compute_advantages(..., return_parts=True)`), with the same
   model as student and teacher (a live teacher).
4. AUCs with bootstrap 95% intervals over episodes:
   - turn level: does a turn's credit (the mean of A~ / |A| over its generated tokens) rank progress
     turns above the others? Within successful episodes (credit should go to progress turns) and
     within failed ones (blame to the others), pooled over turns and within episodes (pairs of one
     episode only). GRPO gives every turn of an episode the same credit: 0.5 within episodes.
     StepOPSD's per-step budget makes every turn's mean |A~| equal by design (it moves credit among
     the tokens of a turn): it is judged at token level, and at turn level with the budget off.
   - the raw signals at turn level: the evidence e_k (teacher minus student log-prob over the turn's
     scored span) and the student's own log-prob of the span (what the model already knows);
     and how much of e_k is only the privileged text flattening the model's distribution (lowering
     the tokens it is sure of, raising the others): the correlation r of e_k with the student's
     log-prob, and the AUC of what is left of e_k after the least-squares part b * lp_S is removed
     (`... beyond lp_S`): the information the privileged text adds;
   - token level (StepOPSD, RLSD): inside the action, the tokens that agree with the expert's action
     at that state against those that depart from it: does sign(A) (w_t - 1) give the agreeing ones
     more credit, in successful and in failed episodes? And the raw gap delta_t, and lp_S.
Prints the tables and writes OUT/credit_quality.json.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

METHODS = ("grpo", "gigpo", "stepopsd", "stepopsd-nobudget", "agentopsd", "rlsd")


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--env", default="agentgym/ALFWorld-Pick-v0")
    ap.add_argument("--tasks", type=int, default=32)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--detour", type=float, default=0.5, help="the expert's random-detour rate")
    ap.add_argument("--max-turns", type=int, default=8)
    ap.add_argument("--policy-episodes", type=int, default=0, help="also score the warm-started policy's own rollouts")
    ap.add_argument("--warm-start", choices=("plain", "literate"), default="literate")
    ap.add_argument("--literate-share", type=float, default=0.5)
    ap.add_argument("--sft-episodes", type=int, default=400)
    ap.add_argument("--sft-epochs", type=int, default=5)
    ap.add_argument("--tiny-hidden", type=int, default=128)
    ap.add_argument("--tiny-layers", type=int, default=2)
    ap.add_argument("--train-games", type=int, default=1000,
                    help="Pick training games, a panel of Pick games only: the warm start's and the scored episodes' "
                    "games (benchmarks/warm_start.py: a tiny model memorises 200 games, not 1,000)")
    ap.add_argument("--bootstrap", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="runs/credit_quality")
    ap.add_argument("--quick", action="store_true", help="16 tasks x 4, 300 warm-start episodes, 300 bootstrap draws")
    args = ap.parse_args(argv)
    if args.train_games < 1:
        ap.error(f"--train-games must be >= 1, got {args.train_games}")
    return args


# ---------------------------------------------------------------------------------------------
# AUC with intervals


def auc(scores, labels, strata=None) -> float | None:
    """P(score of a positive > score of a negative) (ties count half); with `strata`, only pairs
    within one stratum count (within-episode AUC). None when there is no pair."""
    import numpy as np

    scores, labels = np.asarray(scores, dtype=float), np.asarray(labels, dtype=bool)
    groups = [slice(None)] if strata is None else [np.asarray(strata) == s for s in set(strata)]
    wins = pairs = 0.0
    for g in groups:
        pos, neg = scores[g][labels[g]], scores[g][~labels[g]]
        if len(pos) == 0 or len(neg) == 0:
            continue
        diff = pos[:, None] - neg[None, :]
        wins += float((diff > 0).sum() + 0.5 * (diff == 0).sum())
        pairs += diff.size
    return wins / pairs if pairs else None


def auc_with_interval(items, draws: int, rng, strata: bool = False) -> dict:
    """items: per episode, (scores, labels). The AUC over all episodes and a bootstrap 95% interval
    from resampling episodes."""
    import numpy as np

    def compute(sample):
        scores, labels, groups = [], [], []
        for j, (s, lab) in enumerate(sample):
            scores += list(s)
            labels += list(lab)
            groups += [j] * len(s)
        return auc(scores, labels, groups if strata else None)

    point = compute(items)
    if point is None:
        return {"auc": None, "low": None, "high": None, "episodes": len(items)}
    values = []
    for _ in range(draws):
        pick = rng.integers(0, len(items), size=len(items))
        value = compute([items[i] for i in pick])
        if value is not None:
            values.append(value)
    low, high = (float(np.percentile(values, 2.5)), float(np.percentile(values, 97.5))) if values else (None, None)
    return {"auc": point, "low": low, "high": high, "episodes": len(items)}


# ---------------------------------------------------------------------------------------------


def expert_action_marks(tokenizer, rows, r, k, response: str, expert_action: str | None, span_positions):
    """For the scored tokens of turn k in row r: 1 where the token's characters lie in a word of the
    agent's action that agrees with the expert's action (same word at the same place), 0 where it
    departs, None for tag and punctuation tokens (neither)."""
    import re

    from agentgym_opsd.parsing import parse_action
    from trainer.chat import generated_char_offsets

    parsed = parse_action(response, ("action", "search", "answer"))
    if parsed.span is None or expert_action is None:
        return None
    a, b = parsed.span
    content = response[a:b]
    inner_start = content.find(">") + 1
    inner = content[inner_start:content.rfind("<")] if "<" in content[inner_start:] else content[inner_start:]
    words = [(m.start() + a + inner_start, m.end() + a + inner_start, m.group()) for m in re.finditer(r"\S+", inner)]
    expert = expert_action.split()
    ids = rows.input_ids[r, span_positions].tolist()
    text, offsets = generated_char_offsets(tokenizer, ids)
    first = response.find(text) if text else -1
    if first < 0:
        return None
    marks = []
    for s, e in offsets:
        s, e = s + first, e + first
        hit = [i for i, (ws, we, _) in enumerate(words) if s < we and e > ws]
        if not hit:
            marks.append(None)
            continue
        marks.append(int(all(i < len(expert) and words[i][2] == expert[i] for i in hit)))
    return marks


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.quick:
        args.tasks, args.sft_episodes, args.bootstrap = 16, 300, 300
    import numpy as np
    import torch

    import agentgym_opsd
    from agentgym_opsd.io import atomic_write_json
    from agentgym_opsd.rollout import EpisodeRequest, run_episodes
    from trainer.config import TrainConfig
    from trainer.credit_records import credit_pass
    from trainer.local import LocalTrainer
    from trainer.warm_start import PerturbedExpert

    torch.set_num_threads(1)
    agentgym_opsd.load_plugins()
    started = time.perf_counter()
    out = Path(args.out)
    env_options = {"room": "small", "split": "train", "max_turns": args.max_turns, "panel_own_types": True,
                   "panel_size": {"train": args.train_games, "valid_seen": 0, "valid_unseen": 0}, "progress": False}

    # 1. the warm start (cached)
    warm = out / f"warmstart-{args.warm_start}-{args.train_games}games"
    if not (warm / "model" / "config.json").exists():
        literate = {"sft_privileged": args.literate_share} if args.warm_start == "literate" else {}
        config = TrainConfig(
            env_id=args.env, out=str(warm), method="grpo", model="tiny", tokenizer="trained", vocab_size=1024,
            tiny_hidden=args.tiny_hidden, tiny_layers=args.tiny_layers, env_options={**env_options, "max_turns": 12},
            sft_episodes=args.sft_episodes, sft_epochs=args.sft_epochs, sft_noise=0.25, sft_lr=3e-3, steps=0,
            save_every=0, eval_episodes=0, seed=args.seed, device="cpu", **literate,
        )
        LocalTrainer(config, progress=True).run()
    from trainer.policy import load_policy

    model, tokenizer = load_policy(str(warm / "model"), device="cpu")
    model.eval()
    warm_seconds = time.perf_counter() - started

    # 2. episodes with oracle labels
    make_env = lambda: agentgym_opsd.make(args.env, **env_options, turn_labels=True)  # noqa: E731
    requests = [EpisodeRequest(seed=50_000 + t, episode_id=f"t{t}-g{i}", group=f"t{t}")
                for t in range(args.tasks) for i in range(args.group_size)]
    episodes = run_episodes(make_env, PerturbedExpert(args.detour, seed=args.seed), requests,
                            num_envs=len(requests), context="full", progress="expert with detours")
    if args.policy_episodes:
        from trainer.sampling import HFPolicyAgent

        agent = HFPolicyAgent(model, tokenizer, max_new_tokens=24, temperature=1.0, seed=args.seed, name="policy")
        more = [EpisodeRequest(seed=60_000 + t, episode_id=f"p{t}-g{i}", group=f"p{t}")
                for t in range(max(1, args.policy_episodes // args.group_size)) for i in range(args.group_size)]
        played = run_episodes(make_env, agent, more, num_envs=len(more), context="full", progress="policy")
        agent.annotate(played)
        episodes += played
    episodes = [e for e in episodes if e.error is None]
    success = sum(e.success for e in episodes) / len(episodes)
    labels = {e.episode_id: e.hindsight.details["turn_labels"] for e in episodes}
    progress_share = float(np.mean([lab["progress"] for ls in labels.values() for lab in ls]))

    # 3. every method's credit, and 4. the AUCs
    rng = np.random.default_rng(args.seed)
    from trainer.env_knowledge import credit_config

    results: dict[str, dict] = {}
    confidence: dict[str, dict] = {}  # per evidence: r(e_k, lp_S) and the slope b, per outcome
    for name in METHODS:
        method = name.split("-")[0]
        overrides = {"teacher_mode": "live", "decay_steps": 0}
        if name == "stepopsd-nobudget":
            overrides["budget"] = False
        config = credit_config(args.env, method, **overrides)
        rows, student, parts = credit_pass(model, model, tokenizer, episodes, config)  # a live teacher
        advantages, A = parts.advantages, parts.A_episode
        turn_items = {"success": [], "failure": []}
        evidence_items = {"success": [], "failure": []}
        student_items = {"success": [], "failure": []}
        token_items = {"success": [], "failure": []}
        token_gap_items = {"success": [], "failure": []}
        token_student_items = {"success": [], "failure": []}
        paired = {"success": [], "failure": []}  # per episode: (e_k, lp_S, progress) of turns with both
        for e, episode in enumerate(episodes):
            side = "success" if episode.success else "failure"
            K = episode.num_turns
            credit, prog, ev, lp_sum = [], [], [], []
            tok_scores, tok_labels, tok_gap, tok_lp = [], [], [], []
            for r in (rows.row_episode == e).nonzero().squeeze(1).tolist():
                for k in range(K):
                    mine = rows.turn_id[r] == k
                    span = mine & rows.span[r]
                    if not bool(mine.any()):
                        continue
                    label = labels[episode.episode_id][k]
                    if float(A[e]) != 0:  # float64 mean, rounded: equal token values give an exact tie
                        credit.append(round(float(advantages[r][mine].double().mean()) / abs(float(A[e])), 6))
                    else:
                        credit.append(None)
                    prog.append(bool(label["progress"]))
                    lp_sum.append(float(student[r][span].sum()) if bool(span.any()) else None)
                    ev.append(float(parts.evidence[e, k]) if parts.evidence is not None else None)
                    if parts.token_weight is not None and bool(span.any()) and float(A[e]) != 0:
                        positions = span.nonzero().squeeze(1)
                        marks = expert_action_marks(tokenizer, rows, r, k, episode.turns[k].response,
                                                    label.get("expert_action"), positions)
                        if marks:
                            sign = 1.0 if float(A[e]) > 0 else -1.0
                            for p, mark in zip(positions.tolist(), marks, strict=True):
                                if mark is None:
                                    continue
                                tok_scores.append(sign * (float(parts.token_weight[r, p]) - 1.0))
                                tok_gap.append(float(parts.delta[r, p]))
                                tok_lp.append(float(student[r, p]))
                                tok_labels.append(bool(mark))
            keep = [i for i, c in enumerate(credit) if c is not None]
            if keep:
                turn_items[side].append(([credit[i] for i in keep], [prog[i] for i in keep]))
            keep = [i for i, v in enumerate(ev) if v is not None]
            if keep:
                evidence_items[side].append(([ev[i] for i in keep], [prog[i] for i in keep]))
            keep = [i for i, v in enumerate(lp_sum) if v is not None]
            if keep:
                student_items[side].append(([lp_sum[i] for i in keep], [prog[i] for i in keep]))
            keep = [i for i in range(len(ev)) if ev[i] is not None and lp_sum[i] is not None]
            if keep:
                paired[side].append([(ev[i], lp_sum[i], prog[i]) for i in keep])
            if tok_scores:
                token_items[side].append((tok_scores, tok_labels))
                token_gap_items[side].append((tok_gap, tok_labels))
                token_student_items[side].append((tok_lp, tok_labels))
        entry = {}
        for side in ("success", "failure"):
            if name != "stepopsd":  # StepOPSD's budget equalises every turn's mean |A~|: judged at token level
                entry[f"turn/{side}/pooled"] = auc_with_interval(turn_items[side], args.bootstrap, rng)
                entry[f"turn/{side}/within"] = auc_with_interval(turn_items[side], args.bootstrap, rng, strata=True)
            if token_items[side]:
                entry[f"token/{side}"] = auc_with_interval(token_items[side], args.bootstrap, rng)
        results[name] = entry
        # the raw signals, once per teacher: StepOPSD's (hindsight block), AgentOPSD's (skill note)
        kind = {"stepopsd": "hindsight", "agentopsd": "skills"}.get(name)
        if kind:
            raw = {}
            for side in ("success", "failure"):
                raw[f"turn/{side}/within"] = auc_with_interval(evidence_items[side], args.bootstrap, rng, strata=True)
                if token_gap_items[side]:
                    raw[f"token/{side}"] = auc_with_interval(token_gap_items[side], args.bootstrap, rng)
            results[f"evidence ({kind})"] = raw
            beyond, confidence[kind] = {}, {}
            for side in ("success", "failure"):
                flat = np.array([t[:2] for ep in paired[side] for t in ep], dtype=float).reshape(-1, 2)
                if len(flat) < 3 or flat[:, 1].std() == 0:
                    continue
                r = float(np.corrcoef(flat[:, 0], flat[:, 1])[0, 1])
                b = float(np.polyfit(flat[:, 1], flat[:, 0], 1)[0])  # e_k ~ a + b lp_S (a: no effect within episodes)
                confidence[kind][side] = {"r": r, "b": b}
                items = [([ev_ - b * lp for ev_, lp, _ in ep], [pr for _, _, pr in ep]) for ep in paired[side]]
                beyond[f"turn/{side}/within"] = auc_with_interval(items, args.bootstrap, rng, strata=True)
            results[f"{kind} beyond lp_S"] = beyond
        if name == "stepopsd":  # the student's own log-prob of the scored span
            results["student log-prob"] = {
                **{f"turn/{s}/within": auc_with_interval(student_items[s], args.bootstrap, rng, strata=True) for s in ("success", "failure")},
                **{f"token/{s}": auc_with_interval(token_student_items[s], args.bootstrap, rng) for s in ("success", "failure") if token_student_items[s]},
            }

    wall = time.perf_counter() - started
    header = (f"{args.env}, small rooms, max {args.max_turns} turns; {len(episodes)} episodes ({args.tasks} tasks x "
              f"{args.group_size}, expert with detours p={args.detour}{', + policy rollouts' if args.policy_episodes else ''}): "
              f"{100 * success:.0f}% success, {100 * progress_share:.0f}% of turns progress | warm start {args.warm_start} | "
              f"AUC [95% interval over episodes, {args.bootstrap} draws]")
    columns = ["turn/success/pooled", "turn/success/within", "turn/failure/pooled", "turn/failure/within",
               "token/success", "token/failure"]

    def cell(v):
        if not v or v.get("auc") is None:
            return "-"
        return f"{v['auc']:.2f} [{v['low']:.2f}, {v['high']:.2f}]"

    lines = [header, f"{'':<22}" + "".join(f"{c:>24}" for c in columns)]
    for name, entry in results.items():
        lines.append(f"{name:<22}" + "".join(f"{cell(entry.get(c)):>24}" for c in columns))
    for kind, sides in confidence.items():
        lines.append(f"evidence ({kind}) against the student's log-prob of the span: " + "; ".join(
            f"{side} r = {v['r']:+.2f}, slope {v['b']:+.2f}" for side, v in sides.items()))
    lines.append(f"warm start {warm_seconds:.0f}s; total {wall:.0f}s")
    table = "\n".join(lines)
    print(table)
    atomic_write_json(out / f"credit_quality-{args.warm_start}.json",
                      {"args": vars(args), "success": success, "progress_share": progress_share, "results": results,
                       "confidence": confidence, "wall_seconds": wall, "table": table})
    return 0


if __name__ == "__main__":
    sys.exit(main())
