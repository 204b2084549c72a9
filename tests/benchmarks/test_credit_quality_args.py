"""benchmarks.credit_quality answers bad arguments with one usage line, not a traceback."""

from __future__ import annotations




def test_bad_arguments_are_usage_errors(tmp_path, usage_errors):
    cases = (
        (["--train-games", "0"], "--train-games must be >= 1"),
        (["--train-games", "many"], "invalid int value"),
        (["--tasks", "0"], "--tasks must be >= 1"),
        (["--detour", "1.5"], "--detour is a probability"),
        (["--model", str(tmp_path)], "no config.json"),
        (["--model", "tiny", "--family", "webshop"], "ALFWorld Pick only"),
        (["--family", "all", "--env", "agentgym/WebShop-v0"], "not both"),
        (["--env", "agentgym/Nope-v0"], "no env registered"),
    )
    usage_errors("credit_quality", cases)
