"""The application: the one place that wires envs, retrieval and the trainer together (a top-level package
of its own, beside the contract `agentgym_opsd`, which it imports like every other layer).

`cli` (the `agentgym-opsd` command and its command table) and `cli_agents` (its `--agent` and
`--cpu-threads`), `bench`, `bench_config` and `bench_commands` (benchmarking agents), `report` (tables, charts,
the HTML report), `demo` (the main job), `serve_policy` (an OpenAI-compatible endpoint over a local model), and the
model-backed agents `policy_agents` (`hf:PATH`) and `openai_agent` (`openai:URL#MODEL`), which register as agent kinds
through the `agentgym_opsd.agents` entry-point group. Nothing below this package imports it.
"""
