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


def test_count_axes_tick_in_integers() -> None:
    """Counts get 0, 1, 2… (or 0, 2, 4… / 0, 50, 100…), never 0.25 requests."""
    from audit.charts import count_ticks

    assert count_ticks(1) == [0, 1] and count_ticks(3) == [0, 1, 2, 3] and count_ticks(0) == [0, 1]
    assert count_ticks(7) == [0, 2, 4, 6, 8] and count_ticks(230) == [0, 50, 100, 150, 200, 250]
    assert all(float(t).is_integer() for peak in range(1, 500, 7) for t in count_ticks(peak))
    assert all(count_ticks(peak)[-1] >= peak and len(count_ticks(peak)) <= 7 for peak in range(1, 2000, 13))
    svg = line_chart("Requests", ["2026-01-01T10:05:00Z", "2026-01-01T10:06:00Z"], {"n": {"2026-01-01T10:05:00Z": 1}},
                     percent=False).svg
    assert ">0.25<" not in svg and ">10:05<" in svg


def test_bars_and_points_link_where_told_and_nowhere_otherwise() -> None:
    """A bar with a URL is wrapped in an SVG link (escaped); without URLs there are none."""
    linked = bar_chart("Tools", [("read_file", 2)], links=["/admin/audit/finding/?q=read_file&severity=all"]).svg
    assert '<a href="/admin/audit/finding/?q=read_file&amp;severity=all"' in linked
    assert "<a " not in bar_chart("Tools", [("read_file", 2)]).svg
    point = line_chart("Rate", ["2026-01-01T00:00:00Z"], {"a": {"2026-01-01T00:00:00Z": 0.5}},
                       links={"a": {"2026-01-01T00:00:00Z": "/x?y=1"}}).svg
    assert '<a href="/x?y=1"' in point
