"""A benchmark's results page: the script rewrites what is above the marker and keeps the discussion below it."""

from __future__ import annotations

from benchmarks.common import DISCUSSION_MARKER, markdown_table, write_results_page
from tests.test_docs import COMMAND, COMMIT, markdown_tables, table_cells


def test_a_rewrite_keeps_the_hand_written_discussion_and_replaces_the_figures(tmp_path):
    page = write_results_page("speed", "Speed", "old figure: 1.0", command="python -m benchmarks.speed --page",
                              threads=2, load=[1.5, 2.0], commit="abc1234", pages=tmp_path)
    page.write_text(page.read_text() + "Why 1.0: the cache was cold.\n")
    write_results_page("speed", "Speed", "new figure: 2.0", command="python -m benchmarks.speed --page",
                       threads=2, load=[0.5], commit="def5678", pages=tmp_path)
    text = page.read_text()
    above, below = text.split(DISCUSSION_MARKER)
    assert "new figure: 2.0" in above and "old figure" not in text
    assert "Why 1.0: the cache was cold." in below and text.count(DISCUSSION_MARKER) == 1
    # the page passes the docs checks: it names its command and commit
    assert COMMAND.search(above) and COMMIT.search(above) and "def5678" in above


def test_a_table_cell_with_a_pipe_keeps_the_headers_cell_count():
    table = markdown_table(["flag", "meaning"], [["`--a | --b`", "either"], ["x", "y|z"]])
    [(width, rows)] = markdown_tables(table + "\n")
    assert width == 2 and [len(table_cells(row)) for _, row in rows] == [2, 2]


def table_widths(body: str) -> list[tuple[int, list[int]]]:
    """(header's cell count, [cell count of each row]) of each table in a page body."""
    return [(width, [len(table_cells(row)) for _, row in rows]) for width, rows in markdown_tables(body)]


def test_credit_speeds_page_shows_each_methods_time_and_ratio_to_grpo():
    from benchmarks.credit_speed import results_page_body

    timings = {"grpo": (0.010, 0.012, 0.011), "gigpo": (0.030, 0.031, 0.030), "stepopsd": (0.250, 0.3, 0.26)}
    body = results_page_body(100, 10, 100, {"full": (100, 2064, timings), "window": (1000, 356, timings)})
    assert "100,000 generated tokens" in body and "[100 x 2064]" in body and "[1000 x 356]" in body
    assert [w for w, _ in table_widths(body)] == [7, 7]
    assert all(cells == [7] * 3 for _, cells in table_widths(body))  # one row per method
    # 10 ms on 100k generated tokens is 10 ms/100k; stepopsd at 25x GRPO misses the 20x target
    assert "| grpo | 10.0 | 12.0 | 11.0 | 10.00 | 1.00 | ok |" in body
    assert "| stepopsd | 250.0 | 300.0 | 260.0 | 250.00 | 25.00 | MISS |" in body


def test_the_command_a_page_names_runs_the_benchmark_with_its_arguments_quoted():
    from benchmarks.common import benchmark_command

    assert benchmark_command("env_pool", ["--envs", "cpu,webshop", "--page"]) == \
        "python -m benchmarks.env_pool --envs cpu,webshop --page"
    assert benchmark_command("warm_start", ["--model", "runs/my model"]) == \
        "python -m benchmarks.warm_start --model 'runs/my model'"


def test_alfworld_game_costs_page_shows_each_measures_median_and_range():
    from benchmarks.alfworld_game_costs import results_page_body

    body = results_page_body({"file_kb": [10.0, 30.0, 20.0], "propositions": [5, 9, 7]}, 12.34, [40.0, 2.0, 4.0, 3.0])
    assert "3 embedded train games" in body
    assert "| file_kb | 20.00 | 10.00 | 30.00 |" in body and "| propositions | 7.00 | 5.00 | 9.00 |" in body
    assert "12.3 MB" in body and "| 40.0 ms |" in body and "| 3.0 ms |" in body  # first lookup, then the median
    assert table_widths(body) == [(4, [4, 4]), (2, [2, 2, 2])]


def test_warm_starts_page_shows_each_panels_success_with_its_interval():
    from benchmarks.warm_start import results_page_body

    results = {"train (its own games)": {"games": 10, "wins": 7, "success": 0.7, "ci95": [0.397, 0.892],
                                         "format_ok": 0.99, "admissible": 0.9},
               "valid_seen, twin-free": {"split": "valid_seen", "games": 0}}
    body = results_page_body("warm start: model m", results)
    assert body.startswith("warm start: model m")
    assert "| train (its own games) | 10 | 7 | 70.0% | [39.7, 89.2] | 99.0% | 90.0% |" in body
    assert table_widths(body) == [(7, [7, 7])]  # a panel with no games keeps the row's cells


def test_teacher_speeds_page_shows_each_phase_and_the_ratio_to_grpo():
    from benchmarks.teacher_speed import results_page_body

    best = {("grpo", None): {"rows": 0.1, "old_logprobs": 0.2, "credit": 0.1, "update": 1.6, "total": 2.0},
            ("stepopsd", "prefix"): {"rows": 0.1, "old_logprobs": 0.2, "teacher": 0.5, "credit": 0.2, "update": 1.6,
                                     "total": 2.6}}
    body = results_page_body("batch: 4 episodes", best)
    assert "| grpo | - | 0.10 | 0.20 | 0.00 | 0.10 | 1.60 | 2.00 | 1.00 |" in body
    assert "| stepopsd | prefix | 0.10 | 0.20 | 0.50 | 0.20 | 1.60 | 2.60 | 1.30 |" in body
    assert table_widths(body) == [(9, [9, 9])]


def test_a_small_plot_goes_next_to_the_page_and_a_large_one_stays_with_the_run(tmp_path):
    from benchmarks.common import PAGE_PLOT_MAX_BYTES, page_plot

    pages, run = tmp_path / "pages", tmp_path / "run"
    run.mkdir()
    (run / "small.png").write_bytes(b"\x89PNG" + bytes(1000))
    (run / "large.png").write_bytes(b"\x89PNG" + bytes(PAGE_PLOT_MAX_BYTES))
    assert page_plot(run / "small.png", "speed", pages=pages) == ("speed.png",)
    assert (pages / "speed.png").read_bytes() == (run / "small.png").read_bytes()
    assert page_plot(run / "large.png", "big", pages=pages) == () and not (pages / "big.png").exists()
    assert page_plot(run / "missing.png", "gone", pages=pages) == ()
    page = write_results_page("speed", "Speed", "1.0", command="python -m benchmarks.speed", commit="abc1234",
                              plots=("speed.png",), pages=pages)
    assert "![speed](speed.png)" in page.read_text()


def test_retrieval_qualitys_page_shows_answer_and_support_recall():
    from benchmarks.retrieval_quality import K, results_page_body

    recall = {f"recall@{k}": k / K for k in range(1, K + 1)}
    support = {**{f"support_recall@{k}": k / 20 for k in range(1, K + 1)},
               **{f"all_support@{k}": k / 40 for k in range(1, K + 1)}}
    results = {"corpus": {"passages": 12033}, "answer_recall": {"NQ | open": {"questions": 50, **recall,
                                                                            "answer_in_corpus": 0.8}},
               "support_recall": {"HotpotQA": {"questions": 100, **support}}}
    body = results_page_body(results)
    assert "12,033 passages" in body
    assert "| NQ \\| open | 50 | 0.100 | 0.300 | 1.000 | 0.800 |" in body  # a pipe in a name is escaped
    assert "| HotpotQA | 100 | 0.050 | 0.150 | 0.500 | 0.075 | 0.250 |" in body
    assert table_widths(body) == [(6, [6]), (7, [7])]


def test_webshop_experts_page_lists_the_misses_with_their_reasons():
    from benchmarks.webshop_expert import results_page_body

    figures = {"expert": {"goals": 4, "success": 0.5, "mean_score": 0.875, "mean_turns": 5.0},
               "random": {"goals": 4, "success": 0.0, "mean_score": 0.1, "mean_turns": 10.75},
               "expert_failures": [
                   {"task_id": "test-1", "score": 0.75, "asin": "B01", "reasons": ["size | color", "x"]},
                   {"task_id": "test-3", "score": 0.5, "asin": "B03", "reasons": ["not found"]}],
               "tagger": {"line": "type tagger: skipped"}}
    body = results_page_body(figures, {"not found": 1, "unattainable on the target": 1}, "type tagger: skipped",
                             shown=1)
    assert "| expert | 4 | 0.5000 | 0.8750 | 5.00 |" in body and "| random | 4 | 0.0000 | 0.1000 | 10.75 |" in body
    assert "misses: 2, by cause: not found 1, unattainable on the target 1" in body
    assert "| test-1 | 0.750 | B01 | size \\| color; x |" in body and "test-3" not in body and "1 more" in body
    assert table_widths(body) == [(5, [5, 5]), (4, [4])]


def test_webshop_speeds_page_has_one_row_per_figure():
    from benchmarks.webshop_speed import results_page_body

    figures = {"catalog": "builtin", "products": 1200, "goals": 3000, "envs": 64, "episodes": 192,
               "search_ms_p50": 4.25, "mean_score": None}
    body = results_page_body(figures)
    assert "64 env instances over the builtin catalog (1,200 products, 3,000 goals), 192 episodes" in body
    assert "| `search_ms_p50` | 4.25 |" in body and "| `mean_score` | - |" in body
    assert table_widths(body) == [(2, [2] * len(figures))]


def test_alfworld_speeds_page_shows_each_engines_latency_and_the_thread_rates():
    from benchmarks.alfworld_speed import results_page_body

    results = {"games": "2 games", "notes": ["ratio ours/raw: step 0.0250", "mismatches: 0"],
               "latencies": [("ours", "step", [0.001, 0.003, 0.002]), ("raw", "reset (load | reset)", [0.5])],
               "threads": {"games": 2, "rounds": 3, "steps_per_s": {1: 400.0, 2: 500.0}, "c_share": 0.25}}
    body = results_page_body(results)
    assert "| ours | step | 2.00 | 2.00 | 3 |" in body
    assert "| raw | reset (load \\| reset) | 500.00 | 500.00 | 1 |" in body
    assert "- ratio ours/raw: step 0.0250" in body and "25.0% of a step" in body
    assert "| 2 | 500 | 1.25 |" in body  # against the first thread count
    assert table_widths(body) == [(5, [5, 5]), (3, [3, 3])]
    del results["threads"]
    assert table_widths(results_page_body(results)) == [(5, [5, 5])]


def test_the_scale_page_names_each_runs_command_and_commit_and_keeps_its_discussion(tmp_path):
    from benchmarks.scale import write_report

    def run(size: int, items_mib: float, commit: str) -> dict:
        return {"items_mib": items_mib, "command": f"python -m benchmarks.scale --webshop {size}", "commit": commit,
                "load": {"load_mean": 1.5, "load_max": 2.0}}

    results = {"machine": {"cpus": 2, "memory_gib": 23.5},
               "runs": {"webshop": {"1000": run(1000, 2.0, "abc1234"), "10000": run(10000, 20.0, "def5678")}}}
    write_report(results, tmp_path, command="python -m benchmarks.scale --report")
    page = tmp_path / "scale.md"
    page.write_text(page.read_text() + "What the sizes mean for a user.\n")
    results["runs"]["webshop"]["10000"] = run(10000, 21.0, "abc1234")  # measured again, at one commit
    text = write_report(results, tmp_path, command="python -m benchmarks.scale --webshop 10000 --again")
    above, below = text.split(DISCUSSION_MARKER)
    assert "What the sizes mean for a user." in below and "def5678" not in text
    assert "Measured at commit abc1234" in above and "    python -m benchmarks.scale --webshop 10000 --again" in above
    assert "`python -m benchmarks.scale --webshop 10000` (commit abc1234)" in above
    assert COMMAND.search(above) and COMMIT.search(above) and (tmp_path / "webshop.png").is_file()
    assert all(cells == [width] * len(cells) for width, cells in table_widths(above))


def test_retrieval_speeds_page_shows_each_servers_figures_and_the_ratios_to_the_goals():
    from benchmarks.retrieval_speed import results_page_body

    def r(qps: float) -> dict:
        return {"qps": qps, "p50_ms": 12.34, "p99_ms": 40.0, "server_cpu_ms_per_query": 1.5, "errors": 0}

    results = {"queries": 1805, "topk": 3, "rounds": 9, "seconds": 4.0, "build": {"seconds": 6.3},
               "in_process": {"qps": 2000.0, "cpu_ms_per_query": 0.5}, "peak_rss_mib": {"ours": 300},
               "medians": {"ours": {"16 clients x 1 query": r(1200.0)},
                           "Search-R1-shaped": {"16 clients x 1 query": r(400.0)}},
               "ratios": {"16 clients x 1 query": {"ours_over_in_process": 0.6, "ours_over_search_r1_shaped": 3.0,
                                                   "ours_over_search_r1_shaped_per_round": [2.5, 3.5],
                                                   "goal_over_in_process": 0.5}}}
    body = results_page_body(results)
    assert "| 16 clients x 1 query | ours | 1,200 | 12.3 | 40.0 | 1.50 | 0 |" in body
    assert "| 16 clients x 1 query | 3.00x | 2.50-3.50x | 0.60x | >= 0.5x |" in body
    assert "2,000 queries/s" in body and "ours 300" in body
    assert table_widths(body) == [(7, [7, 7]), (5, [5])]


def test_the_load_page_shows_the_warm_up_and_the_load_with_their_failures():
    from benchmarks.load import LoadResult, results_page_body

    warm = LoadResult(clients=64, seconds=15.0, requests=3000, requests_per_s=200.0, p50_ms=250.0, p99_ms=900.0,
                      max_ms=1500.0)
    load = LoadResult(clients=64, seconds=60.0, requests=12000, failures=1, failure_examples=["wrong ids | q"],
                      requests_per_s=200.0, p50_ms=250.5, p99_ms=800.0, max_ms=1200.0, rss_start_mb=400.0,
                      rss_end_mb=410.0, rss_min_mb=395.0, rss_max_mb=420.0)
    body = results_page_body({"passages": 12033, "queries": 2000, "warmup": warm, "load": load, "slow": None})
    assert "| warmup | 64 | 15 | 3000 | 200 | 250.0 | 900.0 | 1500 | 0 | - |" in body
    assert "| load | 64 | 60 | 12000 | 200 | 250.5 | 800.0 | 1200 | 1 | 400 -> 410 (min 395, max 420) |" in body
    assert "- failure: wrong ids | q" in body and "12,033 passages" in body
    assert table_widths(body) == [(10, [10, 10])]  # the failure list is not read as a table row


def test_train_speeds_page_keeps_the_printed_report_in_one_code_block():
    from benchmarks.train_speed import results_page_body

    lines = ["", "choice  tok/s | x full", "full      100 | 1.00", "lora8     300 | 3.00", ""]
    body = results_page_body(lines)
    assert body == "```\nchoice  tok/s | x full\nfull      100 | 1.00\nlora8     300 | 3.00\n```"
    assert markdown_tables(body) == []  # the fixed-width table is code, not a markdown table with pipes


def test_credit_qualitys_page_shows_each_families_aucs_and_paired_differences():
    from benchmarks.credit_quality import COLUMNS, results_page_body

    auc = {"auc": 0.75, "low": 0.6, "high": 0.9}
    report = {"family": "alfworld", "model": "tiny", "table": "env (room=small) | model tiny | AUC\nmore lines",
              "results": {"grpo": {COLUMNS[0]: {"auc": 0.5, "low": 0.5, "high": 0.5}}, "stepopsd": {COLUMNS[2]: auc}},
              "differences": {"stepopsd - grpo | token/success": {"auc": 0.25, "low": 0.1, "high": 0.4},
                              "rlsd - grpo | token/failure": {"auc": None}},
              "goals": ["stepopsd token/success 0.75 [0.60, 0.90] > 0.7 and above 0.5: met"]}
    body = results_page_body([report, {**report, "family": "webshop", "goals": None}])
    assert "## alfworld, model tiny" in body and "## webshop, model tiny" in body
    assert "env (room=small) ; model tiny ; AUC" in body and "more lines" not in body
    assert "| stepopsd | - | - | 0.75 [0.60, 0.90] | - |" in body
    assert "| stepopsd - grpo | token/success | +0.25 [+0.10, +0.40] |" in body and "| token/failure | - |" in body
    assert body.count("- stepopsd token/success 0.75") == 1  # the goals: ALFWorld's only
    assert table_widths(body) == [(5, [5, 5]), (3, [3, 3])] * 2


def test_the_commit_a_page_names_is_dirty_for_code_changes_but_not_for_the_pages_own_files(monkeypatch, tmp_path):
    import subprocess

    from benchmarks import common

    def git(*args):
        subprocess.run(["git", "-C", str(tmp_path), "-c", "user.email=t@t", "-c", "user.name=t", *args],
                       check=True, capture_output=True)

    (tmp_path / "docs" / "benchmarks").mkdir(parents=True)
    (tmp_path / "code.py").write_text("x = 1\n")
    (tmp_path / "docs" / "benchmarks" / "speed.png").write_bytes(b"old plot")
    git("init", "-q")
    git("add", ".")
    git("commit", "-qm", "start")
    monkeypatch.setattr(common, "REPO", tmp_path)
    monkeypatch.setattr(common, "PAGES", tmp_path / "docs" / "benchmarks")
    clean = common.git_commit()
    assert clean != "unknown" and "+changes" not in clean
    # a page writes its plot before the page: that is not a change to what it measured
    (tmp_path / "docs" / "benchmarks" / "speed.png").write_bytes(b"new plot")
    assert common.git_commit() == clean
    (tmp_path / "code.py").write_text("x = 2\n")
    assert common.git_commit() == clean + "+changes"
