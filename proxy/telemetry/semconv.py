"""The attribute, event and metric names toolrelay's traces follow: the one place they are spelled.

Pinned version: **OpenTelemetry semantic conventions 1.44.0** (GenAI "Development" status; the
``opentelemetry-semantic-conventions`` 0.66b2 Python package carries the same names, and the GenAI
group has since moved to the ``semantic-conventions-genai`` repository). Names of 1.37+ are used:
``gen_ai.provider.name`` (not the older ``gen_ai.system``), ``gen_ai.usage.input_tokens`` /
``output_tokens`` (not ``prompt_tokens`` / ``completion_tokens``). toolrelay's own attributes and
events live under ``toolrelay.*``. tests/proxy/test_telemetry.py checks the GenAI names against the
installed package, so a rename upstream shows as a failing test, not as a silent drift.
"""

# ruff: noqa: S105 - "token" in attribute names, not secrets

from __future__ import annotations

from typing import Final

#: The semantic-conventions version followed (also the tracer's schema URL).
VERSION: Final = "1.44.0"
SCHEMA_URL: Final = f"https://opentelemetry.io/schemas/{VERSION}"

# ----- GenAI (spans and metrics) -----
OPERATION_NAME: Final = "gen_ai.operation.name"
PROVIDER_NAME: Final = "gen_ai.provider.name"
REQUEST_MODEL: Final = "gen_ai.request.model"
REQUEST_STREAM: Final = "gen_ai.request.stream"
REQUEST_MAX_TOKENS: Final = "gen_ai.request.max_tokens"
RESPONSE_MODEL: Final = "gen_ai.response.model"
RESPONSE_ID: Final = "gen_ai.response.id"
RESPONSE_FINISH_REASONS: Final = "gen_ai.response.finish_reasons"
RESPONSE_TIME_TO_FIRST_CHUNK: Final = "gen_ai.response.time_to_first_chunk"  # seconds
USAGE_INPUT_TOKENS: Final = "gen_ai.usage.input_tokens"
USAGE_OUTPUT_TOKENS: Final = "gen_ai.usage.output_tokens"
USAGE_CACHE_READ_INPUT_TOKENS: Final = "gen_ai.usage.cache_read.input_tokens"
USAGE_CACHE_CREATION_INPUT_TOKENS: Final = "gen_ai.usage.cache_creation.input_tokens"
USAGE_REASONING_OUTPUT_TOKENS: Final = "gen_ai.usage.reasoning.output_tokens"
TOKEN_TYPE: Final = "gen_ai.token.type"
TOOL_NAME: Final = "gen_ai.tool.name"
OUTPUT_MESSAGES: Final = "gen_ai.output.messages"  # only with the tenant's trace content capture on

#: ``gen_ai.operation.name`` of every upstream call (chat.completions).
OPERATION_CHAT: Final = "chat"
#: ``gen_ai.token.type`` values.
TOKEN_INPUT: Final = "input"
TOKEN_OUTPUT: Final = "output"

# GenAI metric names (OTLP side; Prometheus side: ``toolrelay_gen_ai_*`` in infra.metrics).
METRIC_TOKEN_USAGE: Final = "gen_ai.client.token.usage"
METRIC_OPERATION_DURATION: Final = "gen_ai.client.operation.duration"
METRIC_TIME_TO_FIRST_CHUNK: Final = "gen_ai.client.operation.time_to_first_chunk"
#: USD per upstream call at the price in force (the conventions have no cost metric yet: ours, in their shape).
METRIC_COST: Final = "toolrelay.gen_ai.client.cost"

# ----- general conventions -----
HTTP_REQUEST_METHOD: Final = "http.request.method"
HTTP_RESPONSE_STATUS_CODE: Final = "http.response.status_code"
HTTP_ROUTE: Final = "http.route"
URL_PATH: Final = "url.path"
USER_AGENT_ORIGINAL: Final = "user_agent.original"
SERVER_ADDRESS: Final = "server.address"
SERVER_PORT: Final = "server.port"
ERROR_TYPE: Final = "error.type"

# ----- toolrelay's own -----
REQUEST_ID: Final = "toolrelay.request.id"
TENANT: Final = "toolrelay.tenant"
ROUTE: Final = "toolrelay.route"
PATH: Final = "toolrelay.path"  # pass-through | guarded | non-stream
CLIENT_PROTOCOL: Final = "toolrelay.client.protocol"
OUTCOME: Final = "toolrelay.outcome"
ATTEMPTS: Final = "toolrelay.attempts"
ATTEMPT_NUMBER: Final = "toolrelay.attempt.number"
UPSTREAM: Final = "toolrelay.upstream"
ATTEMPT_OUTCOME: Final = "toolrelay.attempt.outcome"  # clean | normalized | repaired | retry | upstream-error
BYTES_RECEIVED: Final = "toolrelay.attempt.bytes_received"
FRAMES: Final = "toolrelay.attempt.frames"
#: Cost in USD at the price in force (``billing``): an attempt's on its span (``cost.usd``); on the request span
#: its split into ``delivered`` (the attempt the client got; always) and ``wasted`` (attempts discarded; only
#: when above 0): the request's cost is their sum.
COST_USD: Final = "toolrelay.cost.usd"
COST_DELIVERED_USD: Final = "toolrelay.cost.delivered_usd"
COST_WASTED_USD: Final = "toolrelay.cost.wasted_usd"
COST_UNPRICED: Final = "toolrelay.cost.unpriced"  # set (true) only when an attempt had tokens and no price
COST_KIND: Final = "toolrelay.cost.kind"  # delivered | wasted (the cost metric's attribute)

#: A guard finding, an event on its attempt's span.
EVENT_FINDING: Final = "toolrelay.guard.finding"
FINDING_KIND: Final = "toolrelay.finding.kind"
FINDING_SEVERITY: Final = "toolrelay.finding.severity"
FINDING_DECISION: Final = "toolrelay.finding.decision"  # the action: retry, repaired, normalized, ...
FINDING_CHOICE: Final = "toolrelay.finding.choice"
FINDING_FRAME: Final = "toolrelay.finding.frame"  # 0-based SSE frame index in the attempt
FINDING_OFFSET: Final = "toolrelay.finding.offset"  # byte offset in the attempt's body
FINDING_DETAIL: Final = "toolrelay.finding.detail"  # content capture only (scrubbed)
FINDING_FRAGMENT: Final = "toolrelay.finding.fragment"  # content capture only (scrubbed)

#: An answer the upstream client asked again past (a refused parameter, a refusal) inside one attempt.
EVENT_REFUSAL: Final = "toolrelay.upstream.refused"
#: Events on the request span.
EVENT_RETRY: Final = "toolrelay.retry"
RETRY_CAUSE: Final = "toolrelay.retry.cause"  # broken_output | upstream_error
RETRY_REASON: Final = "toolrelay.retry.reason"  # the first finding's kind, or the error type
EVENT_RETRY_BUDGET: Final = "toolrelay.retry_budget.spent"
EVENT_LOOP_BROKEN: Final = "toolrelay.loop_breaker"
LOOP_RULE: Final = "toolrelay.loop.rule"
EVENT_LIMIT: Final = "toolrelay.limit.refused"
#: An agent session moved to another upstream or key (``proxy.routing``: its own failed).
EVENT_SESSION_MOVED: Final = "toolrelay.session.moved"
LIMIT_CODE: Final = "toolrelay.limit.code"
