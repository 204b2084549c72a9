"""What command lines of any folder share: one-line user errors and `KEY=VALUE` options.

A command of any folder (trainer, retrieval index, env families) is a function that adds its arguments
to the parser the app made for it, named `module:function` in the app's command table
(`agentgym_app.cli.COMMANDS`); the function that runs it raises `UsageError` for a user's mistake, and
the app prints it as one line and exits with status 2. `parse_options` reads `--option KEY=VALUE`
pairs, `make_env_factory` checks an env's options before a run starts.
"""

from __future__ import annotations

import json
from typing import Any

import gymnasium as gym

from agentgym_opsd.registry import EnvOptionError, check_env_options, entry, make

__all__ = ["UsageError", "parse_options", "format_option", "check_env_usage", "make_env_factory"]


class UsageError(Exception):
    """A user error: printed as one line, exit status 2."""


def parse_options(pairs: list[str] | None) -> dict[str, Any]:
    """`KEY=VALUE` strings to keyword arguments; values are read as JSON when they parse (3, 0.5,
    true, null, [1,2]) and as plain strings otherwise."""
    out: dict[str, Any] = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key.isidentifier():
            raise UsageError(f"--option {pair!r}: write it as KEY=VALUE, e.g. --option split=valid_seen")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def format_option(key: str, value: Any) -> str:
    """The `KEY=VALUE` that `parse_options` reads back as `{key: value}`: JSON, except a string that
    JSON would not read, which stays plain (`room=small`, but `name="3"` for the string "3")."""
    if isinstance(value, str):
        try:
            json.loads(value)
        except json.JSONDecodeError:
            return f"{key}={value}"
    return f"{key}={json.dumps(value)}"


def check_env_usage(env_id: str, options: dict[str, Any]) -> None:
    """Check an env id and its options against the env's keywords (`check_env_options`) without
    building it: an unknown id or option, or a value of the wrong kind, is a one-line error."""
    entry(env_id)
    try:
        check_env_options(env_id, options)
    except EnvOptionError as e:
        raise UsageError(str(e)) from None


def make_env_factory(env_id: str, options: dict[str, Any]):
    """A function that builds the env, after `check_env_usage` and one trial build (which may
    generate or load data); a bad option is a one-line UsageError that names it."""
    check_env_usage(env_id, options)

    def factory() -> gym.Env:
        return make(env_id, **options)

    try:
        factory().close()
    except (TypeError, ValueError) as e:
        given = ", ".join(f"{k}={v!r}" for k, v in options.items()) or "none"
        raise UsageError(f"{env_id}: {str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__} "
                       f"(options: {given}; `agentgym-opsd list --options {env_id}` lists them)") from None
    return factory
