"""``audit.fragments``: frames numbered like the guard, JSON indented, the failing spot marked, all escaped."""

from __future__ import annotations

from audit.fragments import pretty_frame, render_fragment, render_frames, split_frames

BODY = ('data: {"a":1}\n\n'
        ": keep-alive\n\n"
        'data:{"b":[1,2]}\r\n\r\n'
        'data: {"c": "<x>", "d": tru\n\n'
        "data: [DONE]\n\n")


def test_it_numbers_and_locates_frames_like_the_guard() -> None:
    """0-based dispatched events with the byte offset of their first field line; comments are not frames."""
    frames = split_frames(BODY)
    assert [(f.number, f.offset) for f in frames] == [(0, 0), (1, 29), (2, 49), (3, 78)]
    assert frames[1].comments == ("keep-alive",)


def test_it_indents_json_payloads() -> None:
    """A JSON data payload is shown with json.dumps(indent=2)."""
    html, notes = pretty_frame('data: {"b":[1,2]}')
    assert html == 'data: {\n  &quot;b&quot;: [\n    1,\n    2\n  ]\n}' and notes == []


def test_it_marks_where_a_payload_stops_being_json() -> None:
    """The character where parsing failed is wrapped in <mark>, with the parser's message as a note."""
    html, notes = pretty_frame('data: {"c": "<x>", "d": tru')
    assert '&quot;d&quot;: <mark title="parsing failed here">t</mark>ru' in html
    assert "&lt;x&gt;" in html and "<x>" not in html
    assert notes == ["not JSON: Expecting value at character 18"]


def test_it_marks_the_end_of_a_truncated_payload() -> None:
    """A payload cut short gets an end marker."""
    html, _ = pretty_frame('data: {"p": ')
    assert html.endswith('<mark title="ends here">⟂</mark>')


def test_it_highlights_marked_frames_with_their_labels() -> None:
    """Marked frames are highlighted and labelled; others are not."""
    html = render_frames(split_frames(BODY), {2: ["sse-data-without-space"]})
    assert html.count("tr-frame-marked") == 1 and "sse-data-without-space" in html
    assert "frame 2 · byte offset 49" in html


def test_it_says_when_no_fragment_is_stored() -> None:
    """A purged (or never stored) fragment says so instead of showing nothing."""
    assert "purged" in render_fragment("", frame=1, offset=2, label="k")
