"""The OpenRLHF bridge: the suite's environments and per-turn credit at GPU scale.

Training runs on OpenRLHF 0.11.2 (Ray + vLLM + DeepSpeed), not on a loop of ours. The bridge adds
what OpenRLHF has no notion of, and nothing else:

- `agent_func.py`: the agent module for `--train.agent_func_path` (`AgentExecutor`), which plays
  any registered env (`rollout.py`; token bookkeeping in `trainer/chat.py`);
- `dataset.py`: the prompt dataset (one row per task: env id, split, seed);
- `samples.py`: OpenRLHF's samples generator, keeping the executor's turn ids and records;
- `experience.py`, `credit_rows.py`, `teacher.py`: OpenRLHF's experience maker with the credit
  core's advantages, and the teacher forward on the actor group;
- `ray_trainer.py`: OpenRLHF's Ray trainer actor with those two parts installed;
- `launch.py`, `presets.py`, `cli.py`: `agentgym-opsd train-openrlhf` and `openrlhf-prompts`.

Importing this package imports neither OpenRLHF nor Ray (the modules that need them say so).
"""
