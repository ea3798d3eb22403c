"""Linear-time regular expressions for client-supplied JSON Schemas.

A tool's schema comes from the client and the string it is matched against from the model, so a
``pattern`` such as ``^(a+)+$`` checked with Python's backtracking ``re`` could hold the proxy's event
loop for minutes (catastrophic backtracking; it also holds the GIL, so a thread does not help).
Here ``pattern``, ``patternProperties`` and ``additionalProperties`` (which consults
``patternProperties``) are evaluated with RE2 (``google-re2``), whose matching time is linear in the
input. A pattern RE2 cannot express (back-references, look-around) is not enforced: the proxy is
not the last validator, and a false violation would cost a paid retry.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping
from typing import Any

import re2  # type: ignore[import-untyped]
from jsonschema import Draft7Validator, Draft202012Validator
from jsonschema.exceptions import ValidationError
from jsonschema.protocols import Validator
from jsonschema.validators import extend

_OPTIONS = re2.Options()
_OPTIONS.log_errors = False  # an unsupported client pattern is expected, not an error to log


@functools.lru_cache(maxsize=2048)
def _compiled(pattern: str) -> Any:
    try:
        return re2.compile(pattern, _OPTIONS)
    except Exception:  # noqa: BLE001 -- re2.error and friends: the pattern is outside RE2's syntax
        return None


def search(pattern: str, text: str) -> bool | None:
    """Whether ``pattern`` matches somewhere in ``text`` (JSON Schema semantics: unanchored),
    or None when the pattern cannot be evaluated in linear time."""
    compiled = _compiled(pattern) if isinstance(pattern, str) else None
    return None if compiled is None else compiled.search(text) is not None


def _pattern(validator: Validator, pattern: str, instance: Any, schema: Mapping[str, Any]) -> Iterator[ValidationError]:
    if validator.is_type(instance, "string") and search(pattern, instance) is False:
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


def _matches_any(key: str, patterns: Mapping[str, Any]) -> bool:
    return any(search(p, key) is not False for p in patterns)


def _pattern_properties(validator: Any, patterns: Mapping[str, Any], instance: Any,
                        schema: Mapping[str, Any]) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        for key, value in instance.items():
            if search(pattern, key) is not False:
                yield from validator.descend(value, subschema, path=key, schema_path=pattern)


def _additional_properties(validator: Any, additional: Any, instance: Any,
                           schema: Mapping[str, Any]) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    properties = schema.get("properties", {})
    patterns = schema.get("patternProperties", {})
    extras = sorted(k for k in instance if k not in properties and not _matches_any(k, patterns))
    if validator.is_type(additional, "object"):
        for key in extras:
            yield from validator.descend(instance[key], additional, path=key)
    elif additional is False and extras:
        listed = ", ".join(repr(k) for k in extras)
        yield ValidationError(f"Additional properties are not allowed ({listed} unexpected)")


_SAFE = {"pattern": _pattern, "patternProperties": _pattern_properties,
         "additionalProperties": _additional_properties}

_SAFE_CLASSES: dict[Any, Any] = {
    Draft202012Validator: extend(Draft202012Validator, _SAFE),  # type: ignore[no-untyped-call]
    Draft7Validator: extend(Draft7Validator, _SAFE),  # type: ignore[no-untyped-call]
}


def safe_class(cls: type[Validator]) -> type[Validator]:
    """The RE2-backed variant of a jsonschema validator class (drafts 7 and 2020-12; others as is)."""
    safe: type[Validator] = _SAFE_CLASSES.get(cls, cls)
    return safe


def strip_backtracking_keywords(schema: Any) -> Any:
    """``schema`` without ``unevaluatedProperties`` when ``patternProperties`` appears anywhere in it:
    jsonschema evaluates that combination with ``re`` internally, so it is not enforced (see above)."""
    return _without(schema, "unevaluatedProperties") if _uses(schema, "patternProperties") else schema


def _uses(schema: Any, keyword: str) -> bool:
    if isinstance(schema, list):
        return any(_uses(s, keyword) for s in schema)
    return isinstance(schema, dict) and (keyword in schema or any(_uses(v, keyword) for v in schema.values()))


def _without(schema: Any, keyword: str) -> Any:
    if isinstance(schema, list):
        return [_without(s, keyword) for s in schema]
    if not isinstance(schema, dict):
        return schema
    return {k: _without(v, keyword) for k, v in schema.items() if k != keyword}
