"""``audit.charts``: inline SVG, escaped labels, gaps in lines, an empty state."""

from __future__ import annotations

from audit.charts import bar_chart, line_chart


def test_it_draws_one_bar_per_row_and_escapes_labels() -> None:
    """Labels are escaped; the longest bar spans the full width."""
    svg = bar_chart("Tools <top>", [("<script>x</script>", 4), ("read_file", 2)]).svg
    assert svg.startswith("<svg") and svg.count("<rect") == 2
    assert "<script>" not in svg and "&lt;script&gt;" in svg and "Tools &lt;top&gt;" in svg
    assert 'width="330.0"' in svg and 'width="165.0"' in svg


def test_it_breaks_a_line_where_a_bucket_has_no_value() -> None:
    """A bucket missing from a series splits its polyline."""
    buckets = ["2026-01-01T00:00:00Z", "2026-01-02T00:00:00Z", "2026-01-03T00:00:00Z", "2026-01-04T00:00:00Z"]
    line = {"a": {buckets[0]: 0.5, buckets[1]: 0.25, buckets[3]: 1.0}}
    svg = line_chart("Rate", buckets, line).svg
    assert svg.count("<polyline") == 1 and svg.count("<circle") == 3
    assert "01-02: 25.0%" in svg


def test_it_says_when_there_is_no_data() -> None:
    """No rows: a short note instead of an empty frame."""
    assert "No data for this period." in bar_chart("Tools", []).svg
    assert "No data for this period." in line_chart("Rate", ["2026-01-01T00:00:00Z"], {}).svg
