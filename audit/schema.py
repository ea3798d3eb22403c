"""JSON Schema (draft 2020-12) of the report's JSON summary, ``schema_version`` 1.

The prose version is docs/reports.md. Objects are closed (``additionalProperties: false``) so a new
field is a deliberate change: add it here and in the docs; bump ``schema_version`` only when a field
changes meaning or disappears (consumers may ignore fields they do not know).
"""

from __future__ import annotations

from typing import Any

_INT: dict[str, Any] = {"type": "integer", "minimum": 0}
_RATE: dict[str, Any] = {"type": "number", "minimum": 0, "maximum": 1}
_SECONDS: dict[str, Any] = {"type": "number", "minimum": 0}
_USD: dict[str, Any] = {"type": "number", "minimum": 0}
_TEXT: dict[str, Any] = {"type": "string"}
_TIME: dict[str, Any] = {"type": "string", "pattern": r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$"}


def _object(**properties: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": sorted(properties),
            "additionalProperties": False}


def _rows(**properties: dict[str, Any]) -> dict[str, Any]:
    return {"type": "array", "items": _object(**properties)}


_REQUEST_COLUMNS: dict[str, dict[str, Any]] = {
    "requests": _INT, "guarded": _INT, "corrupted": _INT, "corruption_rate": _RATE, "exhausted": _INT,
    "wasted_completion_tokens": _INT, "wasted_unknown_requests": _INT, "wasted_seconds": _SECONDS,
    "cost_usd": _USD, "wasted_usd": _USD, "unpriced": _INT,
}
_SERIES_COLUMNS: dict[str, dict[str, Any]] = {
    "bucket": _TIME, "guarded": _INT, "corrupted": _INT, "corruption_rate": _RATE,
}

SUMMARY_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "toolrelay report summary",
    **_object(
        schema_version={"const": 1},
        generated_at=_TIME,
        period=_object(since=_TIME, until=_TIME, bucket={"enum": ["minute", "hour", "day"]}),
        scope=_object(tenants={"type": ["array", "null"], "items": _TEXT},
                      upstreams={"type": ["array", "null"], "items": _TEXT}),
        totals=_object(
            requests=_INT, guarded=_INT, guarded_share=_RATE, touched=_INT, corrupted=_INT,
            corruption_rate=_RATE, recovered=_INT, exhausted=_INT, attempts=_INT, prompt_tokens=_INT,
            completion_tokens=_INT, wasted_completion_tokens=_INT, wasted_unknown_requests=_INT,
            wasted_seconds=_SECONDS, cost_usd=_USD, wasted_usd=_USD, unpriced=_INT, findings=_INT,
            guarded_attempts=_INT, faulty_attempts=_INT, attempt_fault_rate=_RATE, failed_attempts=_INT),
        outcomes={"type": "object", "additionalProperties": _INT},
        by_upstream=_rows(upstream_id={"type": ["integer", "null"]}, upstream=_TEXT,
                          tenant={"type": ["string", "null"]}, **_REQUEST_COLUMNS),
        by_model=_rows(model=_TEXT, **_REQUEST_COLUMNS),
        by_kind=_rows(kind=_TEXT, findings=_INT, requests=_INT, fatal=_INT, share=_RATE, wasted_usd=_USD),
        over_time=_rows(requests=_INT, **_SERIES_COLUMNS),
        over_time_by_upstream=_rows(upstream_id=_INT, upstream=_TEXT, **_SERIES_COLUMNS),
        over_time_by_model=_rows(model=_TEXT, **_SERIES_COLUMNS),
        over_time_by_kind=_rows(bucket=_TIME, kind=_TEXT, requests=_INT),
        recovery_by_attempt=_rows(attempt={"type": "integer", "minimum": 1}, requests=_INT, share=_RATE),
        tools=_rows(tool=_TEXT, findings=_INT, requests=_INT, fatal=_INT),
        clients=_rows(user_agent=_TEXT, **_REQUEST_COLUMNS),
    ),
}
#: Per member (``audit.people``): in built reports, not in the dashboard's figures (so not required).
SUMMARY_SCHEMA["properties"]["by_member"] = _rows(
    member_id={"type": ["integer", "null"]}, member=_TEXT, tenant=_TEXT, requests=_INT, prompt_tokens=_INT,
    completion_tokens=_INT, wasted_prompt_tokens=_INT, wasted_completion_tokens=_INT, wasted_unknown_requests=_INT,
    wasted_seconds=_SECONDS, corrupted=_INT, corruption_rate=_RATE, exhausted=_INT, recovered=_INT,
    loops_broken=_INT, limits_hit=_INT, retry_budget_spent=_INT, incidents=_INT, cost_usd=_USD, wasted_usd=_USD,
    unpriced=_INT)
