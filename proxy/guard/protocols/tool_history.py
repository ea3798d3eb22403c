"""Make a translated chat history valid around tool calls (PROTOCOLS.md 1.1 message rules, 2.6).

Chat upstreams refuse a history in which an assistant message with ``tool_calls`` is not followed,
right away, by one ``tool`` message per ``tool_call_id`` ("An assistant message with 'tool_calls'
must be followed by tool messages responding to each 'tool_call_id'", openai/codex#7051), or in
which a ``tool`` message answers no call. Anthropic and Responses histories break that order in
ways their own APIs accept: Claude Code puts ``role: "system"`` messages anywhere (section 0 item
13), a client may split one turn over consecutive assistant messages (the Anthropic API merges
consecutive same-role turns) or send a result twice, or drop one.

``pair_tool_messages(messages)`` returns the history with:

- consecutive assistant messages merged into one (text joined, calls and reasoning concatenated),
  each call id kept once;
- after each assistant message with calls, exactly one ``tool`` message per call id, in call
  order: the results found before the next assistant message (several for one id are joined);
  a call with none gets ``MISSING_RESULT``;
- the other messages of that stretch (user, system) after those tool messages, in their order;
- a ``tool`` message that answers no call of the assistant message before it turned into a user
  message that says which call it was for.

and a list of notes (one line per repair) for ``Translation.dropped``. Sans-IO, never raises.
"""

from __future__ import annotations

from typing import Any

#: Content of the tool message sent for a call the client sent no result for.
MISSING_RESULT = "(no result was sent for this tool call)"


def pair_tool_messages(messages: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[str]]:
    """The history with tool messages paired to their calls; see the module docstring."""
    notes: list[str] = []
    merged = _merge_assistants(messages)
    out: list[dict[str, Any]] = []
    i = 0
    while i < len(merged):
        message = merged[i]
        if message.get("role") == "assistant" and message.get("tool_calls"):
            end = next((j for j in range(i + 1, len(merged)) if merged[j].get("role") == "assistant"), len(merged))
            message = _unique_calls(message, notes)
            out.append(message)
            out.extend(_answer(message["tool_calls"], merged[i + 1 : end], notes))
            i = end
            continue
        out.append(_orphan(message, notes) if message.get("role") == "tool" else message)
        i += 1
    return out, notes


def _answer(calls: list[dict[str, Any]], stretch: list[dict[str, Any]], notes: list[str]) -> list[dict[str, Any]]:
    """One tool message per call id (in call order), then the rest of ``stretch``."""
    ids = [str(c.get("id")) for c in calls]
    results: dict[str, list[str]] = {call_id: [] for call_id in ids}
    rest: list[dict[str, Any]] = []
    for message in stretch:
        call_id = message.get("tool_call_id")
        if message.get("role") == "tool" and call_id in results:
            results[call_id].append(_text(message.get("content")))
        else:
            rest.append(_orphan(message, notes) if message.get("role") == "tool" else message)
    out: list[dict[str, Any]] = []
    for call_id in ids:
        found = results[call_id]
        if not found:
            notes.append(f"tool call {call_id} had no result ({MISSING_RESULT!r} sent)")
        elif len(found) > 1:
            notes.append(f"tool call {call_id} had {len(found)} results (joined)")
        content = "\n\n".join(found) if found else MISSING_RESULT
        out.append({"role": "tool", "tool_call_id": call_id, "content": content})
    return out + rest


def _unique_calls(message: dict[str, Any], notes: list[str]) -> dict[str, Any]:
    """``message`` with each call id once (the first call with it kept)."""
    calls = message["tool_calls"]
    unique = list({str(c.get("id")): c for c in reversed(calls)}.values())[::-1]
    if len(unique) == len(calls):
        return message
    notes.append(f"tool calls with a repeated id dropped: {len(calls) - len(unique)}")
    return {**message, "tool_calls": unique}


def _orphan(message: dict[str, Any], notes: list[str]) -> dict[str, Any]:
    """A ``tool`` message that answers no call, as a user message naming the call."""
    call_id = message.get("tool_call_id")
    notes.append(f"tool result for {call_id} answers no preceding tool call (sent as user text)")
    return {"role": "user", "content": f"[result of tool call {call_id}]\n{_text(message.get('content'))}"}


def _merge_assistants(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Consecutive assistant messages as one."""
    out: list[dict[str, Any]] = []
    for message in messages:
        if out and message.get("role") == "assistant" and out[-1].get("role") == "assistant":
            out[-1] = _merge(out[-1], message)
        else:
            out.append(message)
    return out


def _merge(first: dict[str, Any], second: dict[str, Any]) -> dict[str, Any]:
    texts = [t for t in (_text(first.get("content")), _text(second.get("content"))) if t]
    calls = [*(first.get("tool_calls") or []), *(second.get("tool_calls") or [])]
    merged: dict[str, Any] = {"role": "assistant", "content": "\n\n".join(texts) if texts else (None if calls else "")}
    if calls:
        merged["tool_calls"] = calls
    reasoning = _text(first.get("reasoning_content")) + _text(second.get("reasoning_content"))
    if reasoning:
        merged["reasoning_content"] = reasoning
    return merged


def _text(content: Any) -> str:
    """A message content as text (the translators only build strings, None or text parts)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n\n".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""
