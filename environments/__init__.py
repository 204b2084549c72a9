"""Env families, one sub-package each (`alfworld/`, `searchqa/`, `webshop/`), each a `TextEnv`.

Each sub-package's `register()` is an `agentgym_opsd.envs` entry point (see pyproject.toml).
"""
