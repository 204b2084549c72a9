"""The launcher and the CLI against OpenRLHF 0.11.2's REAL `train_ppo_ray` argument parser and checks."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

pytest.importorskip("openrlhf.utils", reason="OpenRLHF is not installed in this venv: run `make test-openrlhf`")

from agentgym_app.cli import main as cli_main
from trainer.openrlhf.config import ENV_VAR, BridgeConfig, TaskLabel
from trainer.openrlhf.launch import AGENT_LOADER, LaunchError, code_runtime_env, installed_trainer, launch
from trainer.openrlhf.presets import FAMILIES, MODELS, preset


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("model", sorted(MODELS))
def test_paper_presets_pass_openrlhfs_parser_and_checks(family, model):
    sections, flags = preset(family, model, "stepopsd", prompts="train.jsonl", eval_prompts="eval.jsonl",
                             prompt_rows=120)
    out = io.StringIO()
    args = launch(BridgeConfig.from_dict(sections), flags, dry_run=True, out=out)
    f = FAMILIES[family]
    # What the bridge needs reached OpenRLHF's args.
    assert args.train.agent_func_path == AGENT_LOADER  # relative: resolves in Ray's working_dir on every node
    assert args.reward.remote_url == ["agent"]  # OpenRLHF's own consequence of an agent path
    assert (args.data.input_key, args.data.label_key, args.data.apply_chat_template) == ("prompt", "label", True)
    assert args.algo.advantage.estimator == "group_norm"
    assert args.rollout.n_samples_per_prompt == 8
    assert args.data.max_len == f.max_len and args.rollout.max_new_tokens == f.turn_max_tokens
    assert args.algo.kl.use_loss and args.actor.eps_clip_low_high == (0.2, 0.2)
    assert args.critic.model_name_or_path is None  # no critic with group_norm
    assert args.train.num_episodes == -(-f.steps * f.prompts_per_step // 120)
    assert args.actor.model_name_or_path == MODELS[model].hub_id
    # The printed command carries the bridge config the workers will read.
    printed = out.getvalue()
    assert printed.startswith(f"{ENV_VAR}=") and "python -m openrlhf.cli.train_ppo_ray" in printed
    assert json.loads(printed.split("=", 1)[1].split("\n", 1)[0].strip("'"))["credit"]["method"] == "stepopsd"


def test_flags_after_the_preset_win_and_bad_ones_are_refused():
    sections, flags = preset("alfworld", "qwen3-1.7b", "agentopsd", prompts="train.jsonl")
    config = BridgeConfig.from_dict(sections)
    args = launch(config, flags + ["--rollout.batch_size", "4", "--train.batch_size", "32"], dry_run=True,
                  out=io.StringIO())
    assert (args.rollout.batch_size, args.train.batch_size) == (4, 32)
    assert sections["rollout"]["chat_template_kwargs"] == {"enable_thinking": False}
    with pytest.raises(LaunchError, match="group_norm"):
        launch(config, flags + ["--algo.advantage.estimator", "rloo"], dry_run=True)
    with pytest.raises(LaunchError, match="async"):
        launch(config, flags + ["--train.async_enable"], dry_run=True)
    with pytest.raises(LaunchError, match="length penalties"):
        launch(config, flags + ["--reward.overlong_buffer_len", "64"], dry_run=True)
    with pytest.raises(LaunchError, match="rejected the flags"):
        launch(config, flags + ["--no.such_flag", "1"], dry_run=True)
    with pytest.raises(LaunchError, match="checks failed: group_norm requires n_samples_per_prompt > 1"):
        launch(config, flags + ["--rollout.n_samples_per_prompt", "1"], dry_run=True)


def test_a_kl_penalty_in_the_reward_is_refused_before_anything_starts():
    """The credit advantages would overwrite a KL penalty folded into the reward: the dry run (and the
    real launch, before Ray) refuses it, with OpenRLHF's own default init_coef (0.01)."""
    sections, flags = preset("alfworld", "qwen3-1.7b", "stepopsd", prompts="train.jsonl")
    config = BridgeConfig.from_dict(sections)
    without_loss = [f for f in flags if f != "--algo.kl.use_loss"]
    assert len(without_loss) == len(flags) - 1
    with pytest.raises(LaunchError, match="KL penalty into the reward"):
        launch(config, without_loss, dry_run=True)
    with pytest.raises(LaunchError, match="KL penalty into the reward"):
        launch(config, without_loss + ["--algo.kl.init_coef", "0.05"], dry_run=False)  # refused before Ray starts
    args = launch(config, without_loss + ["--algo.kl.init_coef", "0"], dry_run=True, out=io.StringIO())
    assert args.algo.kl.init_coef == 0


def test_the_agent_module_resolves_from_a_ray_worker_in_the_shipped_working_dir(tmp_path):
    """Multi-node: no absolute path of this machine reaches the workers. A real Ray worker started with
    the launcher's runtime_env (py_modules + working_dir) loads the executor by the relative path,
    with OpenRLHF's own loader, from a working directory that is not this checkout."""
    import subprocess
    import sys
    import textwrap

    env = code_runtime_env(tmp_path / "workdir")
    assert (tmp_path / "workdir" / AGENT_LOADER).is_file()
    assert sorted(p.rsplit("/", 1)[1]
                  for p in env["py_modules"]) == ["agentgym_opsd", "environments", "retrieval_index", "trainer"]
    script = textwrap.dedent(f"""
        import json, os, ray
        ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False, runtime_env={env!r})

        @ray.remote
        def load():
            from openrlhf.trainer.ray.vllm_engine import _load_agent_executor
            executor = _load_agent_executor({AGENT_LOADER!r})
            import trainer
            return [os.getcwd(), type(executor).__module__, trainer.__file__]

        print(json.dumps(ray.get(load.remote())))
        ray.shutdown()
    """)
    done = subprocess.run([sys.executable, "-c", script], check=False, capture_output=True, text=True, timeout=600,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    cwd, module, trainer_file = json.loads(done.stdout.strip().splitlines()[-1])
    repo = str(Path(__file__).resolve().parents[3])
    assert not cwd.startswith(repo) and not trainer_file.startswith(repo)  # Ray's copies, not this checkout
    assert module == "trainer.openrlhf.agent_func"


def test_installed_trainer_is_what_train_ppo_ray_imports():
    import openrlhf.trainer.ppo_trainer as stock

    from trainer.openrlhf.ray_trainer import AgentGymPPOTrainer, StockPPOTrainer

    original = stock.PPOTrainer
    with installed_trainer() as actor:
        from openrlhf.trainer.ppo_trainer import PPOTrainer

        assert PPOTrainer is actor
        assert actor.__ray_actor_class__ is AgentGymPPOTrainer
        assert issubclass(AgentGymPPOTrainer, StockPPOTrainer) and StockPPOTrainer is original.__ray_actor_class__
    assert stock.PPOTrainer is original


def test_cli_prompts_then_train_dry_run(tmp_path, example_env_id, capsys):
    prompts = tmp_path / "train.jsonl"
    assert cli_main(["openrlhf-prompts", "--env", example_env_id, "--seeds", "0:5,9", "--option", "high=30",
                     "--out", str(prompts)]) == 0
    rows = [json.loads(line) for line in prompts.read_text().splitlines()]
    assert len(rows) == 6
    labels = [TaskLabel.parse(r["label"]) for r in rows]
    assert [lb.seed for lb in labels] == [0, 1, 2, 3, 4, 9] and labels[0].env_kwargs == {"high": 30}
    assert rows[0]["prompt"][0]["role"] == "system" and "between 1 and 30" in rows[0]["prompt"][1]["content"]
    assert rows[0]["datasource"] == "Example/guess" and rows[5]["task_id"] == "guess-10"

    config = tmp_path / "bridge.yaml"
    config.write_text("rollout:\n  turn_max_tokens: 64\ncredit:\n  method: gigpo\n")
    base = ["train-openrlhf", "--config", str(config), "--dry-run", "--",
            "--actor.model_name_or_path", "/models/x", "--data.prompt_dataset", str(prompts),
            "--rollout.n_samples_per_prompt", "4", "--algo.kl.init_coef", "0"]
    capsys.readouterr()
    assert cli_main(base) == 0
    printed = capsys.readouterr().out
    assert "--data.prompt_dataset " + str(prompts) in printed and '"method": "gigpo"' in printed

    config.write_text("credit:\n  method: stepopsd\n  teacher_mode: stale\n")
    assert cli_main(base) == 2
    assert "teacher_mode" in capsys.readouterr().err
    config.write_text("credit:\n  method: stepopsd\n  lam_mix: 3\n")
    assert cli_main(base) == 2
    assert "lam_mix" in capsys.readouterr().err
    config.write_text("rollouts:\n  max_turns: 3\n")
    assert cli_main(base) == 2
    assert "unknown section" in capsys.readouterr().err
    assert cli_main(["train-openrlhf", "--preset", "alfworld", "--dry-run"]) == 2
    assert "--prompts" in capsys.readouterr().err


def test_cli_bad_seeds_and_env(tmp_path, example_env_id, capsys):
    out = str(tmp_path / "p.jsonl")
    assert cli_main(["openrlhf-prompts", "--env", example_env_id, "--seeds", "5:2", "--out", out]) == 2
    assert "START:END" in capsys.readouterr().err
    assert cli_main(["openrlhf-prompts", "--env", "example/Nope-v0", "--seeds", "0:2", "--out", out]) == 2
    assert "no env registered" in capsys.readouterr().err


def test_launch_script_dry_run(tmp_path):
    """scripts/openrlhf/train.sh end to end with DRY_RUN=1: real prompt datasets for WebShop (its
    built-in catalog), then train-openrlhf through OpenRLHF's parser."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[3]
    env = dict(os.environ, DRY_RUN="1", OUT=str(tmp_path / "run"), TRAIN_SEEDS="0:3", EVAL_SEEDS="0:2", GPUS="4",
               PATH=str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""))
    done = subprocess.run(
        ["bash", str(repo / "scripts/openrlhf/train.sh"), "webshop", "qwen3-1.7b", "agentopsd", "--", "--train.seed",
         "7"],
        cwd=tmp_path, env=env, check=False, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [json.loads(line) for line in (tmp_path / "run/train.jsonl").read_text().splitlines()]
    assert len(rows) == 3 and {TaskLabel.parse(r["label"]).env_id for r in rows} == {"agentgym/WebShop-v0"}
    assert len((tmp_path / "run/eval.jsonl").read_text().splitlines()) == 2
    command = done.stdout.strip().splitlines()[-1]
    assert f"--data.prompt_dataset {tmp_path}/run/train.jsonl" in command
    assert "--vllm.num_engines 4" in command and command.endswith("--train.seed 7")
    assert "Qwen/Qwen3-1.7B" in command and '"method": "agentopsd"' in done.stdout
