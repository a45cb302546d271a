"""The benchmark machinery runs end to end on a tiny plan: processes start, load flows, reports are
well formed and no request fails. No timing is asserted: benchmarks print figures, tests do not judge them."""

import json

from bench.run import SMOKE, TABLE_HEAD, TARGETS, run


def test_tiny_benchmark_run_writes_a_complete_report_with_no_errors(tmp_path):
    report = run(SMOKE, tmp_path, pin=False, demo_vocab=True, command="pytest smoke", progress=False)

    data = json.loads((tmp_path / "results.json").read_text())
    assert data["plan"] == "smoke" and data["vocab"] == report["vocab"]
    assert len(data["cells"]) == len(SMOKE.cells()) == 4
    for cell in data["cells"]:
        for target in TARGETS:
            figures = cell[target]
            assert figures["errors"] == 0, figures["error_examples"]
            assert figures["requests"] > 0 and figures["rps"] > 0 and figures["p50_ms"] > 0
        assert cell["gateway"]["cpu_s_per_1k_tokens"] > 0 and cell["gateway"]["peak_rss_mb"] > 0
        assert cell["gateway_vs_relay"]["rps"] > 0 and cell["gateway_vs_direct"]["p50_ms"] > 0
        if cell["stream"]:
            assert cell["gateway"]["ttfe_p50_ms"] is not None
    [many] = data["many_streams"]
    assert many["gateway"]["errors"] == 0 and many["concurrency"] == SMOKE.many_streams
    assert [t["met"] for t in data["targets"] if "concurrent streams" in t["target"]] != []

    markdown = (tmp_path / "results.md").read_text()
    assert TABLE_HEAD in markdown
    rows = [line for line in markdown.splitlines() if line.startswith(("| chat |", "| completions |"))]
    assert len(rows) == len(data["cells"]) + len(data["many_streams"])


def test_store_benchmark_compares_the_default_store_with_none_and_measures_the_file(tmp_path):
    from bench import store

    report = store.run(tmp_path, rounds=1, duration=0.05, pin=False, demo_vocab=True, progress=False)
    assert set(report["summary"]) == {"sqlite", "none"}
    for row in report["summary"].values():
        assert row["errors"] == 0 and row["streams_per_s"] > 0 and row["nonstream_added_p50_ms"] is not None
    figures = report["file"]
    assert figures["responses"] > 0
    # What each stored 100-token k=5 Response takes in its row (issue 19: at most 8 KB on disk).
    assert figures["blob_bytes_per_response"] <= 8192
    assert "Bytes per stored response" in store.markdown(report, "pytest")


def test_workers_benchmark_runs_one_and_two_worker_stacks_with_no_errors(tmp_path):
    from bench import workers

    report = workers.run(tmp_path, rounds=1, duration=0.05, demo_vocab=True, progress=False)
    assert set(report["summary"]) == {1, 2}
    for row in report["summary"].values():
        assert row["errors"] == 0 and row["streams_per_s"] > 0 and row["relay_streams_per_s"] > 0
    assert report["scaling"] > 0 and report["share_of_relay"] > 0
    assert "| 2 |" in workers.markdown(report, "pytest")
