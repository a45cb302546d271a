"""The benchmark machinery runs end to end on a tiny plan: processes start, load flows, reports are
well formed and no request fails. No timing is asserted: benchmarks print figures, tests do not judge them."""

import json
import os
import shutil

import pytest

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

    # The machine's speed around every cell (bench/speed.py), summed up in the report.
    assert all(cell[target]["probe_ms"] > 0 for cell in data["cells"] for target in TARGETS)
    probes = data["probe_ms"]
    assert 0 < probes["min"] <= probes["median"] <= probes["max"] and probes["slowdown"] >= 1.0

    markdown = (tmp_path / "results.md").read_text()
    assert TABLE_HEAD in markdown and "Machine speed: a fixed probe" in markdown
    rows = [line for line in markdown.splitlines() if line.startswith(("| chat |", "| completions |"))]
    assert len(rows) == len(data["cells"]) + len(data["many_streams"])


def test_store_benchmark_compares_the_default_store_with_none_and_measures_the_file(tmp_path):
    from bench import store

    report = store.run(tmp_path, rounds=2, duration=0.05, pin=False, demo_vocab=True, progress=False)
    assert set(report["summary"]) == {"sqlite", "none"}
    # The overhead is taken round by round (each pair ran side by side), every round's kept.
    assert all(len(values) == 2 for values in report["per_round"].values())
    lost = report["per_round"]["streams_per_s"]
    assert report["overhead"]["streams_per_s"] == pytest.approx(sum(lost) / 2)  # the median of two
    for row in report["summary"].values():
        assert row["errors"] == 0 and row["streams_per_s"] > 0
        # Non-streamed on both routes the targets name.
        assert set(row["nonstream"]) == {"chat", "completions"}
        assert all(each["added_p50_ms"] is not None and each["cpu_ms"] > 0 for each in row["nonstream"].values())
    assert set(report["overhead"]) == {"nonstream_added_p50_chat", "nonstream_added_p50_completions",
                                       "streams_per_s"}
    figures = report["file"]
    assert figures["responses"] > 0
    # What each stored 100-token k=5 Response takes in its row (issue 19: at most 8 KB on disk).
    assert figures["blob_bytes_per_response"] <= 8192
    assert report["probe_ms"]["min"] > 0
    text = store.markdown(report, "pytest")
    assert "Bytes per stored response" in text and "Machine speed: a fixed probe" in text
    assert text.count("(rounds: ") == 6
    assert "non-streamed completions: added p50" in text


def test_workers_benchmark_runs_one_and_two_worker_stacks_with_no_errors(tmp_path):
    from bench import workers

    report = workers.run(tmp_path, rounds=1, duration=0.05, demo_vocab=True, progress=False)
    assert set(report["summary"]) == {1, 2}
    for row in report["summary"].values():
        assert row["errors"] == 0 and row["streams_per_s"] > 0 and row["relay_streams_per_s"] > 0
    assert report["scaling"] > 0 and report["share_of_relay"] > 0
    assert "| 2 |" in workers.markdown(report, "pytest")
    assert "the machine allows at most" in workers.markdown(report, "pytest")
    assert report["summary"][2]["cpu_ms_per_stream"]["gateway"]["gateway"] > 0


def test_the_machine_bound_is_the_tightest_of_the_cores_and_each_process():
    """bench.workers' bound: with 2 ms of gateway and 1 ms of other CPU a stream, one worker is held to its own
    core (500/s), two workers to the two cores all three share (2,000 / 3 ms); a process of 1.5 ms a stream
    is held to its one core (667/s) however many relay processes there are."""
    from bench.workers import machine_bound

    cpu = {"gateway": 2.0, "upstream": 0.5, "loadgen": 0.5}
    assert machine_bound(cpu, "gateway", 1, 2) == pytest.approx(500.0)
    assert machine_bound(cpu, "gateway", 2, 2) == pytest.approx(2000 / 3)
    assert machine_bound({"relay": 0.2, "upstream": 0.3, "loadgen": 1.5}, "relay", 2, 2) == pytest.approx(1000 / 1.5)


def test_wrk_counts_an_answer_without_its_stream_end_or_with_another_status_as_an_error(tmp_path):
    """bench.workers --wrk: wrk's Lua check sees every wrk thread's answers (each has its own Lua state)."""
    import shutil

    from bench.canned import Case, record_to_file
    from bench.run import start_stack
    from bench.wrk import drive

    if shutil.which("wrk") is None:
        if os.environ.get("CI"):
            pytest.fail("CI installs wrk (.ci/run's system-packages phase)")
        pytest.skip("no wrk on PATH (Debian: apt-get install wrk)")
    case = Case("chat", True, 5, 20)
    canned = record_to_file([case], tmp_path / "canned.json", use_qwen2=False)
    request = canned["cases"][case.key]["responses_request"]
    with start_stack(canned, tmp_path / "canned.json", tmp_path, burst=True, pin=False, store="none") as stack:
        url = stack.url("gateway") + "/v1/responses"
        good = drive(url, request, ["event: response.incomplete"], 4, 0.5, tmp_path)
        unended = drive(url, request, ["event: response.never"], 4, 0.5, tmp_path)
        refused = drive(url, "{", ["event: response.incomplete"], 4, 0.5, tmp_path)
    assert good["rps"] > 0 and good["errors"] == 0
    assert unended["errors"] > 0 and refused["errors"] > 0


def test_workers_benchmark_with_wrk_and_a_bursting_upstream_has_no_errors(tmp_path):
    import shutil

    from bench import workers

    if shutil.which("wrk") is None:
        if os.environ.get("CI"):
            pytest.fail("CI installs wrk (.ci/run's system-packages phase)")
        pytest.skip("no wrk on PATH (Debian: apt-get install wrk)")
    report = workers.run(tmp_path, rounds=1, duration=0.5, demo_vocab=True, progress=False, load="wrk", burst=True)
    for row in report["summary"].values():
        assert row["errors"] == 0 and row["streams_per_s"] > 0 and row["relay_streams_per_s"] > 0
    assert "load generator wrk, upstream in bursts" in workers.markdown(report, "pytest")


def test_the_speed_probe_says_when_the_machine_slowed_down_during_a_run():
    from bench import speed

    assert speed.probe_ms(rounds=2) > 0
    steady = speed.spread([1.00, 1.10, 1.05])
    assert steady == {"min": 1.0, "median": 1.05, "max": 1.1, "slowdown": 1.1}
    assert speed.sentence(steady).endswith("the machine held its speed.")
    slowed = speed.spread([2.0, 1.0, 1.2, 1.1])
    assert slowed["median"] == 1.15 and slowed["slowdown"] == 2.0
    assert "2.00× between its fastest and slowest" in speed.sentence(slowed)


def test_a_parents_cpu_includes_its_workers(tmp_path):
    """bench.workers measures `serve --workers 2`, whose parent only supervises: the CPU the cells count for
    the process under test is its whole tree's, or the workers' work would show as other load."""
    import subprocess
    import sys
    import time

    from bench import procstat

    script = tmp_path / "parent.py"
    script.write_text("import subprocess, sys\n"
                      "subprocess.Popen([sys.executable, '-c', 'x = 0\\nwhile True:\\n    x += 1']).wait()\n")
    parent = subprocess.Popen([sys.executable, str(script)])
    try:
        deadline = time.monotonic() + 30
        while not procstat.descendants(parent.pid) or procstat.tree_cpu_seconds(parent.pid) < 0.5:
            assert time.monotonic() < deadline, "the child never ran"
            time.sleep(0.05)
        assert procstat.cpu_seconds(parent.pid) < 0.4  # the parent itself waits
    finally:
        for child in procstat.descendants(parent.pid):
            os.kill(child, 9)
        parent.wait()


@pytest.mark.skipif(shutil.which("callgrind_control") is None, reason="valgrind is not installed")
def test_instruction_counts_come_per_request_and_per_thread(tmp_path):
    """bench.instructions under callgrind on a tiny plan: every window has instructions in it (a dump's
    `summary:` line reads 0: the parser must take `totals:`), the store's writer thread is counted apart
    from the event loop, and each window's dumps are kept for callgrind_annotate."""
    from bench import instructions
    from bench.canned import Case

    rows = (Case("chat", False, 5, 100), Case("chat", True, 5, 100))
    report = instructions.run(tmp_path, 3, 1, [None], rows=rows, progress=False)
    assert [(row["store"], row["case"]) for row in report["rows"]] == [
        (store, case.key) for store in instructions.STORES for case in rows]
    for row in report["rows"]:
        relay, gateway = row["relay"], row["gateway"]
        assert relay["loop_per_request"] > 100_000 and gateway["loop_per_request"] > relay["loop_per_request"]
        assert (gateway["other_threads_per_request"] > 0) is (row["store"] == "sqlite")  # the SQLite writer
        assert row["gateway_loop_over_relay"] > 1
    kept = {path.name for path in (tmp_path / "dumps").iterdir()}
    assert "relay.chat.full.k5.n100-01" in kept and "gateway.this.none.chat.stream.k5.n100-01" in kept
    assert "| this tree | sqlite | chat/full/k5/n100 |" in instructions.table(report)
