"""Scenario names: ``mode[=value][:positional][:key=value]...`` (grammar in ``docs/simulator.md``).

A scenario comes from the ``x-sim-scenario`` header or, failing that, the request's ``model``. A
string whose first segment is not a known mode is not a scenario: the request gets ``gen`` with the
server's defaults, so any real model name works against the simulator.
"""

from __future__ import annotations

from dataclasses import dataclass, field

_GEN = frozenset({"ttft", "frame", "frames", "calls", "seed", "text", "reasoning", "broken", "rounds", "refuse",
                  "loop", "usage", "usage-every"})
#: Options each mode accepts (failure modes take the gen options of the stream they disturb).
MODE_OPTIONS: dict[str, frozenset[str]] = {
    "gen": _GEN | {"corrupt", "kinds"},
    "case": frozenset({"broken", "ttft", "frame"}),
    "text": frozenset({"ttft", "frame", "seed", "piece", "refuse"}),
    "slow": frozenset({"ttft", "frame", "seed", "piece", "refuse"}),
    "http": _GEN | {"retry-after"},
    "stall-first-byte": _GEN,
    "stall-after": _GEN | {"ms"},
    "drop-after": _GEN,
    "hostile": _GEN | {"ms", "bytes"},
    "task": frozenset({"steps", "rate", "seed", "kinds", "ttft", "frame"}),
    "cut": frozenset({"how", "accept", "chars", "seed", "ttft", "frame", "broken", "ms", "utf8"}),
}
#: Modes that disturb a generated answer (and may follow ``gen:<options>:``).
_FAILURES = frozenset({"http", "stall-first-byte", "stall-after", "drop-after", "hostile"})
#: Modes whose value (``case:C14``, ``http:429``, ``drop-after=3``) is required.
_VALUE_REQUIRED = frozenset({"cut", "case", "text", "http", "stall-first-byte", "stall-after", "drop-after", "hostile"})


class ScenarioError(ValueError):
    """A scenario string that names a mode but does not parse; answered with HTTP 400."""


@dataclass(frozen=True)
class Scenario:
    """A parsed scenario: ``text`` as given, its ``mode``, ``value`` and ``options``."""

    text: str
    mode: str
    value: str | None = None
    options: dict[str, str] = field(default_factory=dict)

    def get_int(self, name: str, default: int) -> int:
        """Option ``name`` as a non-negative int (``default`` when absent)."""
        return int(self.get_float(name, default))

    def get_float(self, name: str, default: float) -> float:
        """Option ``name`` as a non-negative number (``default`` when absent)."""
        raw = self.options.get(name)
        if raw is None:
            return default
        try:
            number = float(raw)
        except ValueError:
            raise ScenarioError(f"{self.text}: option {name}={raw!r} is not a number") from None
        if number < 0:
            raise ScenarioError(f"{self.text}: option {name} must not be negative")
        return number

    def int_value(self) -> int:
        """The mode's value as a non-negative int (``text:30``, ``drop-after=3``)."""
        try:
            number = int(self.value or "")
        except ValueError:
            raise ScenarioError(f"{self.text}: {self.mode} needs an integer, not {self.value!r}") from None
        if number < 0:
            raise ScenarioError(f"{self.text}: {self.mode} must not be negative")
        return number


def parse_scenario(text: str) -> Scenario | None:
    """Parse ``text``; None when it names no mode (a plain model name).

    A ``gen`` scenario may end in a failure mode, which then applies to that generated answer:
    ``gen:calls=1:http:500:broken=1`` is ``http:500:broken=1`` with ``calls=1``.
    Raises :class:`ScenarioError` for a known mode with bad syntax or options.
    """
    segments = text.strip().split(":")
    mode, _, head_value = segments[0].partition("=")
    if mode not in MODE_OPTIONS:
        return None
    value: str | None = head_value or None
    options: dict[str, str] = {}
    for segment in segments[1:]:
        key, eq, raw = segment.partition("=")
        if mode == "gen" and key in _FAILURES:
            mode, value = key, raw or None
        elif not eq and value is None:
            value = segment
        elif not eq:
            raise ScenarioError(f"{text}: unexpected segment {segment!r} (options are key=value)")
        else:
            options[key] = raw
    unknown = sorted(set(options) - MODE_OPTIONS[mode])
    if unknown:
        allowed = ", ".join(sorted(MODE_OPTIONS[mode]))
        raise ScenarioError(f"{text}: {mode} takes no option {unknown[0]!r} (allowed: {allowed})")
    if mode in _VALUE_REQUIRED and not value:
        raise ScenarioError(f"{text}: {mode} needs a value, e.g. {mode}:3")
    if value and mode not in _VALUE_REQUIRED | {"slow"}:
        raise ScenarioError(f"{text}: {mode} takes no value (options are key=value)")
    return Scenario(text=text.strip(), mode=mode, value=value, options=options)
