"""`agentgym-opsd demo` (`make demo`): the main job, on the embedded defaults only (no downloads).

1. Generate the ALFWorld panel (small rooms; train and valid_seen games of all six task types).
2. Build the built-in Search-QA index (synthetic corpus) and start its retrieval server on loopback.
3. Warm-start a tiny Qwen3 (its tokenizer trained on the env's text) on expert episodes, then train
   it further with GRPO and with StepOPSD side by side on one ALFWorld subset (same start, seeds and
   budget). The last update's per-turn credit is recorded for the report (`credit.jsonl`).
4. Benchmark expert, random and the three tiny policies (the warm start, and the models GRPO and
   StepOPSD trained from it) on the six ALFWorld subsets and on Search-QA.
5. Write one HTML report (tables, charts, training curves, trajectories with their credit) and say
   where it is; its header says what the tiny policies are (a smoke-sized run) and where the real
   figures are (`about.txt`).

Everything goes under `--out` (default runs/demo), caches included, so a fresh clone generates all
of it; a second run reuses what is there. One progress bar follows the stages; each stage shows its
own bar below it.
"""

from __future__ import annotations

import math
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["DemoSettings", "run_demo", "credit_records"]

TRAIN_ENV = "agentgym/ALFWorld-Pick-v0"
SEARCHQA_ENV = "agentgym/SearchQA-Synthetic-v0"
# The bench's names for the tiny policies, and what they are: run folder -> name.
POLICIES = {"warmstart": "warm start", "training/grpo": "grpo", "training/stepopsd": "stepopsd"}

ABOUT = """\
A smoke-sized run: every stage of the main job, end to end, in minutes on a CPU. The tiny policies are a \
{params} randomly initialised Qwen3 ({layers} layers, hidden {hidden}, a {vocab}-token BPE trained on the env's text), \
warm-started on {sft} ALFWorld Pick expert episodes (`warm start`), then trained for {steps} updates of \
{tasks} tasks x {group} episodes with GRPO (`grpo`) and with StepOPSD (`stepopsd`) from that start. \
A policy this small and this briefly trained is not expected to win episodes: their rows and curves show \
the machinery working, not what the methods achieve. They were trained on ALFWorld Pick only (the other \
subsets and Search-QA are tasks they never saw). The training curves show the reward the update used \
(`credit/reward_mean`, with the penalties for invalid turns) beside the env's own (`train/reward`).

The real figures: `python benchmarks/learning.py` (held-out success on ALFWorld Pick after a warm start \
and 20 updates per method, same seeds and budget; the README's Benchmarks table) and \
`python benchmarks/credit_quality.py` (how well each method's per-turn credit singles out the turns \
that decided an episode; being added)."""


@dataclass(frozen=True)
class DemoSettings:
    """The demo's sizes (`quick` shrinks them for a smoke test)."""

    panel_train: int = 16  # ALFWorld games per task type, train split (the trainer's tasks)
    panel_eval: int = 5  # per task type, valid_seen split (the benchmark's tasks and the held-out panel)
    max_turns: int = 15  # ALFWorld turns before truncation (the small rooms' expert needs 3-12)
    searchqa_episodes: int = 12
    sft_episodes: int = 96
    sft_epochs: int = 6
    steps: int = 4
    tasks_per_step: int = 2
    group_size: int = 4
    max_new_tokens: int = 24
    eval_episodes: int = 5  # the held-out panel: every valid_seen Pick game once (greedy: a replay adds nothing)
    vocab_size: int = 1024
    # The benchmark's envs run in this process, 8 at a time: their steps cost less than a worker's
    # round trip, and the policies then write 8 turns per decoding batch instead of one per worker
    # (with 2 workers the stage took 277 s against 41 s, median wall of 2 runs each, here).
    workers: int = 0

    @classmethod
    def quick(cls) -> DemoSettings:
        return cls(panel_train=2, panel_eval=1, max_turns=8, searchqa_episodes=3, sft_episodes=8, sft_epochs=1, steps=1,
                   tasks_per_step=1, group_size=2, max_new_tokens=12, eval_episodes=1, vocab_size=512)


class _Stages:
    """The demo's outer progress bar: one step per stage, the stage's name as its label."""

    def __init__(self, names: Sequence[str]) -> None:
        from tqdm.auto import tqdm

        self.bar = tqdm(total=len(names), desc="demo", unit="stage", position=0, leave=True,
                        bar_format="{desc}: {n_fmt}/{total_fmt} stages |{bar}| {elapsed}")
        self.started = time.perf_counter()
        self.times: dict[str, float] = {}
        self._name: str | None = None
        self._t0 = 0.0

    def start(self, name: str) -> None:
        self._name, self._t0 = name, time.perf_counter()
        self.bar.set_description_str(f"demo: {name}")
        self.bar.refresh()

    def done(self) -> None:
        assert self._name is not None
        self.times[self._name] = round(time.perf_counter() - self._t0, 1)
        self.bar.write(f"  {self._name}: {self.times[self._name]:.0f}s")
        self.bar.update(1)

    def close(self) -> None:
        self.bar.set_description_str("demo: done")
        self.bar.close()


def run_demo(out: str | Path = "runs/demo", *, quick: bool = False, progress: bool = True) -> Path:
    """Run the demo into `out`; returns the report's path."""
    import agentgym_opsd
    from agentgym_opsd.app.bench import config_from_dict, run_bench
    from agentgym_opsd.app.report import write_report
    from agentgym_opsd.io import atomic_write_json

    settings = DemoSettings.quick() if quick else DemoSettings()
    out = Path(out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    agentgym_opsd.load_plugins()
    families = {e.family for e in agentgym_opsd.registered_envs()}
    missing = {"ALFWorld", "SearchQA"} - families
    if missing:
        from agentgym_opsd.core import EnvUnavailable

        raise EnvUnavailable(f"the demo needs the {', '.join(sorted(missing))} envs, which are not installed here (pip install -e .)")
    stages = _Stages(["ALFWorld panel", "Search-QA index and server", "warm start", "GRPO", "StepOPSD", "benchmark", "report"])
    cache = out / "cache"
    sizes = {"train": settings.panel_train, "valid_seen": settings.panel_eval, "valid_unseen": 0}
    alfworld = {"room": "small", "panel_size": sizes, "cache_dir": str(cache / "alfworld"), "max_turns": settings.max_turns,
                "progress": False}
    try:
        stages.start("ALFWorld panel")
        from environments.alfworld.panel import PanelSpec, ensure_panel

        ensure_panel(PanelSpec.make(seed=0, room="small", sizes=sizes), cache / "alfworld", progress=progress)
        stages.done()

        stages.start("Search-QA index and server")
        from environments.searchqa.synthetic import serve_synthetic

        server = serve_synthetic(cache / "searchqa")
        stages.done()
        try:
            models = _train(out, alfworld, settings, stages, progress)
            _write_about(out, settings, models["warm start"])
            stages.start("benchmark")
            # Greedy, at the per-turn cap the policies were trained with; a turn ends at </action>.
            policies = [{"name": name, "agent": f"hf:{model}?temperature=0&max_new_tokens={settings.max_new_tokens}&device=cpu"}
                        for name, model in models.items()]
            config = config_from_dict(
                {
                    "name": "agentgym-opsd demo",
                    "agents": ["expert", "random", *policies],
                    "seeds": [0],
                    "workers": settings.workers,
                    "context": "window:2",
                    "envs": [
                        {"family": "ALFWorld", "splits": ["valid_seen"], "episodes": settings.panel_eval, "options": alfworld},
                        {"id": SEARCHQA_ENV, "splits": ["test"], "episodes": settings.searchqa_episodes,
                         "options": {"server_url": server.url}},
                    ],
                }
            )
            # The server's port changes from run to run, so a second demo starts its benchmark over.
            run_bench(config, out, restart=True, progress=progress, report=False)
            stages.done()
        finally:
            server.stop()
        stages.start("report")
        report = write_report(out)
        stages.done()
    finally:
        stages.close()
    wall = time.perf_counter() - stages.started
    atomic_write_json(out / "demo.json", {"settings": settings.__dict__, "stage_seconds": stages.times, "wall_seconds": round(wall, 1)})
    print((out / "results.md").read_text(encoding="utf-8"))
    print(f"demo finished in {wall / 60:.1f} min; report: {report}")
    return report


# ---------------------------------------------------------------------------------------------
# Training: one warm start, then GRPO and StepOPSD from it.


def _write_about(out: Path, settings: DemoSettings, model: Path) -> None:
    """`about.txt`: what this run is, for the report's header."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from agentgym_opsd.io import atomic_write_text

    config = AutoConfig.from_pretrained(model)
    with torch.device("meta"):  # the architecture only: no weights are read
        count = sum(p.numel() for p in AutoModelForCausalLM.from_config(config).parameters())
    atomic_write_text(out / "about.txt", ABOUT.format(
        params=f"{count / 1e6:.2f}M-parameter", layers=config.num_hidden_layers, hidden=config.hidden_size,
        vocab=config.vocab_size, sft=settings.sft_episodes, steps=settings.steps,
        tasks=settings.tasks_per_step, group=settings.group_size,
    ) + "\n")


def _train(out: Path, alfworld: dict[str, Any], settings: DemoSettings, stages: _Stages, progress: bool) -> dict[str, Path]:
    """Warm start (OUT/warmstart) and the two RL runs (OUT/training/<method>, side by side in the
    report); returns the model folder of each, by its name in the benchmark (`POLICIES`)."""
    from trainer.local import LocalTrainer, TrainConfig

    common = dict(
        env_id=TRAIN_ENV, env_options={**alfworld, "split": "train"}, eval_env_options={"split": "valid_seen"},
        context="window:2", seed=0, eval_episodes=settings.eval_episodes, eval_seed=0, eval_temperature=0.0,
        max_new_tokens=settings.max_new_tokens, device="cpu",
    )
    stages.start("warm start")
    warm = out / "warmstart"
    if not (warm / "report.json").exists():
        shutil.rmtree(warm, ignore_errors=True)  # what an interrupted demo left
        config = TrainConfig(
            out=str(warm), method="grpo", model="tiny", tokenizer="trained", vocab_size=settings.vocab_size,
            sft_episodes=settings.sft_episodes, sft_epochs=settings.sft_epochs, steps=0, save_every=0, **common,
        )
        LocalTrainer(config, progress=progress).run()
    stages.done()
    for method, label in (("grpo", "GRPO"), ("stepopsd", "StepOPSD")):
        stages.start(label)
        run_dir = out / "training" / method
        if not (run_dir / "report.json").exists():
            shutil.rmtree(run_dir, ignore_errors=True)
            config = TrainConfig(
                out=str(run_dir), method=method, model=str(warm / "model"), steps=settings.steps,
                tasks_per_step=settings.tasks_per_step, group_size=settings.group_size, eval_every=settings.steps,
                save_every=0, **common,
            )
            trainer = LocalTrainer(config, progress=progress)
            views = ("grpo",) if method == "grpo" else ("stepopsd", "agentopsd")

            def record_credit(trainer: Any, episodes: list, run_dir: Path = run_dir, views: tuple = views) -> None:
                """After the last update's rollout: the credit that update assigns, per turn."""
                if trainer.step + 1 != trainer.config.steps:
                    return
                from agentgym_opsd.io import append_jsonl

                cfg = trainer.config
                records = credit_records(
                    [e for e in episodes if e.error is None], policy=trainer.model, teacher=trainer.teacher(),
                    tokenizer=trainer.tokenizer, env_id=cfg.env_id, methods=views, step=trainer.step,
                    update=trainer.step + 1, overrides={cfg.method: dict(cfg.credit)},
                    chat_template_kwargs=cfg.chat_template_kwargs, micro_batch_tokens=cfg.micro_batch_tokens,
                )
                append_jsonl(run_dir / "credit.jsonl", records)

            trainer.hooks["after_rollout"].append(record_credit)
            trainer.run()
        stages.done()
    return {name: out / folder / "model" for folder, name in POLICIES.items()}


# ---------------------------------------------------------------------------------------------
# Per-turn credit of one update, in the report's format (agentgym_opsd/report/credit.py).


def credit_records(
    episodes: Sequence[Any],
    *,
    policy: Any,
    teacher: Any,
    tokenizer: Any,
    env_id: str,
    methods: Sequence[str],
    step: int = 0,
    update: int | None = None,
    overrides: dict[str, dict[str, Any]] | None = None,
    chat_template_kwargs: dict[str, Any] | None = None,
    micro_batch_tokens: int = 16384,
) -> list[dict[str, Any]]:
    """What each credit method gives each turn of `episodes`, computed as a trainer's update does:
    token rows (`trainer.rows.build_rows`), the policy's log-probs lp_S, the teacher's log-probs lp_T
    with privileged context (`trainer.teacher.score_teacher`), and the credit core for the advantages
    (`compute_advantages`) and their per-turn parts (gap e_k, StepOPSD token weights w_t, AgentOPSD
    belief B_k, dB_k and turn weight w_k) from the core's own functions.

    Args:
        episodes: finished episodes of complete groups (GRPO normalizes within groups).
        policy, teacher: the student and teacher causal LMs (the same model for a `live` teacher).
        methods: credit methods to record (e.g. `("stepopsd", "agentopsd")`).
        step: the update number (StepOPSD's lam_t schedule).
        update: stored in each record, to match the trainer's `episodes/update_NNNNN.jsonl`.
        overrides: `CreditConfig` overrides per method.

    Returns:
        `credit.jsonl` records: one per episode and method (see `agentgym_opsd.app.report.credit`).
    """
    import torch

    from agentgym_opsd.app.report.credit import credit_record
    from trainer.credit import TurnLayout, compute_advantages, episode_rewards
    from trainer.credit.agentopsd import belief_path, belief_prior, turn_weights
    from trainer.credit.evidence import token_gap, turn_evidence
    from trainer.credit.grpo import broadcast_to_tokens, grpo_episode_advantage
    from trainer.credit.stepopsd import token_weights
    from trainer.env_knowledge import credit_config
    from trainer.rows import build_rows
    from trainer.teacher import row_logprobs, score_teacher

    episodes = list(episodes)
    if not episodes:
        return []
    records = []
    for method in methods:
        config = credit_config(env_id, method, **(overrides or {}).get(method, {}))
        rows = build_rows(episodes, tokenizer, span_mode=config.span_mode, chat_template_kwargs=chat_template_kwargs or {},
                          max_length=getattr(policy.config, "max_position_embeddings", None))
        lp_student = row_logprobs(policy, rows, micro_batch_tokens=micro_batch_tokens)                    # lp_S
        if config.needs_teacher:
            scores = score_teacher(teacher, tokenizer, episodes, rows, config, micro_batch_tokens=micro_batch_tokens)
            batch = rows.credit_batch(lp_student, scores.logprobs, scores.scored, scores.truncated)         # lp_T
        else:
            batch = rows.credit_batch(lp_student)
        advantages, _ = compute_advantages(batch, config, step, diagnostics=False)                         # A~
        layout = TurnLayout.of(batch)
        A_episode = grpo_episode_advantage(episode_rewards(batch, config), batch.episode_group, config.adv_eps)  # A_i
        A = broadcast_to_tokens(A_episode, layout)
        turn_adv = layout.turn_sum(layout.take(advantages)) / layout.turn_count().clamp(min=1)            # mean A~ of turn k
        gap = weights = delta = belief = d_belief = turn_w = None
        if config.needs_teacher:
            scored = layout.span if batch.teacher_scored is None else layout.span & layout.take(batch.teacher_scored)
            delta = token_gap(layout.take(batch.teacher_logprobs), layout.take(batch.student_logprobs), scored, config.max_abs_gap)
            gap = turn_evidence(delta, layout, scored)                                                    # e_k
            if method == "stepopsd":
                weights = token_weights(A, delta, layout.span, config.alpha_clip)                         # w_t
            if method == "agentopsd":
                prior = batch.success if config.prior == "success" else episode_rewards(batch, config)
                B = belief_path(belief_prior(prior, batch.episode_group, config.eps0), gap, layout.exists, config.belief_gamma)
                belief, d_belief = B[:, 1:], B[:, 1:] - B[:, :-1]                                         # B_k, dB_k
                turn_w, _ = turn_weights(d_belief, torch.sign(A_episode), layout.exists, config.b)        # w_k
        token_ids = rows.input_ids.reshape(-1)[layout.index]
        for e, episode in enumerate(episodes):
            K = episode.num_turns
            spans: list[Any] = [None] * K
            tokens: list[Any] = [None] * K
            if weights is not None:
                for k in range(K):
                    mine = ((layout.turn == e * layout.K + k) & layout.span).nonzero().squeeze(1)
                    if mine.numel() == 0:
                        continue
                    pieces = [tokenizer.decode([int(t)]) for t in token_ids[mine]]
                    tokens[k] = [(p, float(weights[i]), float(delta[i])) for p, i in zip(pieces, mine.tolist(), strict=True)]
                    spans[k] = _span_of(episode.turns[k].response, "".join(pieces), episode.turns[k].step.action_span)

            def column(table: Any, e: int = e, K: int = K) -> list[float | None] | None:
                if table is None:
                    return None
                return [v if math.isfinite(v) else None for v in (float(x) for x in table[e, :K].tolist())]

            record = credit_record(
                advantage=float(A_episode[e]), turns=K, gap=column(gap), turn_advantage=column(turn_adv),
                belief=column(belief), belief_delta=column(d_belief), weight=column(turn_w),
                spans=spans if weights is not None else None, tokens=tokens if weights is not None else None, update=update,
            )
            records.append({"episode_id": episode.episode_id, "method": method, **record})
    return records


def _span_of(response: str, text: str, action_span: Any) -> list[int] | None:
    """Where the scored tokens' text sits in the response (None when it is not a slice of it)."""
    if not text:
        return None
    if action_span is not None:
        start = max(0, int(action_span[0]) - 4)
        found = response.find(text, start)
        if found >= 0:
            return [found, found + len(text)]
    found = response.find(text)
    return [found, found + len(text)] if found >= 0 else None
