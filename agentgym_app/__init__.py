"""The application: the one place that wires envs, retrieval and the trainer together (a top-level package
of its own, beside the contract `agentgym_opsd`, which it imports like every other layer).

`cli` (the `agentgym-opsd` command: its command table names each command's module, imported only when
that command runs), `env_commands` (`list`, `play`, `eval`), `cli_agents` and `hf_spec` (`--agent` and
`--cpu-threads`, checked without loading a model), `bench`, `bench_config`, `bench_commands` and
`results` (benchmarking agents), `charts` and `report` (tables, charts, the HTML report), `demo` (the
main job) and `reading_teacher` (its real-model credit section), `serve_policy` (an OpenAI-compatible
endpoint over a local model), and the model-backed agents `policy_agents` (`hf:PATH`) and
`openai_agent` (`openai:URL#MODEL`), which register as agent kinds through the `agentgym_opsd.agents`
entry-point group. Nothing else imports this package.
"""
