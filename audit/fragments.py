"""The fragment viewer: offending SSE frames pretty-printed, with the anomaly marked.

Frames are numbered and located exactly as the guard numbered them (``proxy.guard.stream.sse``: 0-based
dispatched events, byte offset of the event's first field line), so a finding's ``frame`` and
``byte_offset`` point into a stored attempt body. ``data`` payloads that are JSON are shown
indented; a payload that is not JSON is shown as sent with the character where parsing failed
marked. Everything is escaped here; results are safe markup for the admin.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

from proxy.guard.stream.sse import SSEDecoder

#: Frames rendered around the first marked one on a whole-body page.
WINDOW = 200
#: The styles of these classes: ``audit/static/audit/fragments.css`` (no inline styles: the CSP).
CSS = "audit/fragments.css"


@dataclass(frozen=True, slots=True)
class Frame:
    """One SSE event of a body: 0-based ``number``, byte ``offset``, its field lines, comments before it."""

    number: int
    offset: int
    text: str
    comments: tuple[str, ...] = field(default=())


def split_frames(body: str) -> list[Frame]:
    """The events of an attempt body, numbered and located like the guard does."""
    decoder = SSEDecoder()
    events = decoder.feed(body.encode("utf-8")) + decoder.flush()
    return [Frame(e.frame, e.offset, e.raw, e.comments) for e in events]


def _pretty_line(line: str) -> tuple[str, str]:
    """One field line as escaped HTML, and a note when its JSON payload does not parse."""
    name, colon, value = line.partition(":")
    if name != "data" or not colon:
        return escape(line), ""
    lead = line[: len(line) - len(value.removeprefix(" "))]
    payload = value.removeprefix(" ")
    if payload in ("", "[DONE]"):
        return escape(line), ""
    try:
        parsed = json.loads(payload)
    except json.JSONDecodeError as exc:
        return _mark_at(lead, payload, exc.pos), f"not JSON: {exc.msg} at character {exc.pos}"
    return escape(lead + json.dumps(parsed, indent=2, ensure_ascii=False)), ""


def _mark_at(lead: str, payload: str, pos: int) -> str:
    """``lead + payload`` escaped, the character at ``pos`` wrapped in <mark> (a marker at the end)."""
    if pos >= len(payload):
        return f"{escape(lead + payload)}<mark title=\"ends here\">⟂</mark>"
    return (f"{escape(lead + payload[:pos])}<mark title=\"parsing failed here\">{escape(payload[pos])}</mark>"
            f"{escape(payload[pos + 1:])}")


def pretty_frame(text: str) -> tuple[SafeString, list[str]]:
    """A frame's field lines pretty-printed (escaped) and the notes about what did not parse."""
    lines, notes = [], []
    for line in text.splitlines() or [""]:
        html, note = _pretty_line(line)
        lines.append(html)
        if note:
            notes.append(note)
    return mark_safe("\n".join(lines)), notes  # noqa: S308 - built from escaped parts


def _block(title: str, text: str, *, marked: bool, labels: Sequence[str] = ()) -> str:
    body, notes = pretty_frame(text)
    extra = "".join(f" · <strong>{escape(label)}</strong>" for label in labels)
    note = "".join(f'<div class="tr-frame-note">{escape(n)}</div>' for n in notes)
    return (f'<div class="tr-frame{" tr-frame-marked" if marked else ""}">'
            f'<div>{escape(title)}{extra}</div>{note}<pre class="tr-frame-body">{body}</pre></div>')


def render_fragment(text: str, *, frame: int | None, offset: int | None, label: str) -> SafeString:
    """A finding's own offending frame, marked, with where it was seen."""
    if not text:
        return mark_safe('<p class="tr-muted">No fragment stored (policy, not tied to a frame, or '
                         "purged after the tenant's retention days).</p>")
    where = "frame " + ("?" if frame is None else str(frame))
    where += " · byte offset " + ("?" if offset is None else str(offset))
    return mark_safe(_block(where, text, marked=True, labels=[label]))  # noqa: S308 - _block escapes


def render_frames(frames: Sequence[Frame], marks: Mapping[int, Sequence[str]]) -> SafeString:
    """A body's frames (up to ``WINDOW`` around the first marked one), marked ones highlighted."""
    if not frames:
        return mark_safe('<p class="tr-muted">No frames in this body.</p>')
    first = next((i for i, f in enumerate(frames) if f.number in marks), 0)
    start = max(0, first - WINDOW // 4)
    shown = frames[start : start + WINDOW]
    parts = [f"<p>{len(frames)} frames; showing {shown[0].number}–{shown[-1].number}.</p>"]
    for f in shown:
        title = f"frame {f.number} · byte offset {f.offset}"
        if f.comments:
            title += f" · {len(f.comments)} comment line(s) before it"
        parts.append(_block(title, f.text, marked=f.number in marks, labels=marks.get(f.number, ())))
    return mark_safe("".join(parts))  # noqa: S308 - _block escapes


def render_context(body: str, *, frame: int, label: str, around: int = 2) -> SafeString:
    """The frames around ``frame`` in a stored attempt body, ``frame`` marked."""
    frames = split_frames(body)
    near = [f for f in frames if abs(f.number - frame) <= around]
    return render_frames(near, {frame: [label]})
