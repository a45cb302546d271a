"""The soak tool, bounded for CI: a few seconds of concurrent streams, zero errors, bounded memory.
(The 10-minute, 200-stream run and its figures are in bench/RESULTS.md.)"""

from bench.soak import soak


def test_short_soak_has_no_errors_and_bounded_memory_growth():
    figures = soak(streams=20, seconds=6)
    assert figures["errors"] == 0, figures["error_kinds"]
    assert figures["requests"] >= 20
    assert figures["rss_growth_after_warmup_mb"] < 40
    assert figures["rss_peak_mb"] < 300
