"""Typed findings: every anomaly the guard absorbs, repairs or rejects.

The finding kinds are one enumerated list, used unchanged by the audit tables and the reports.
Every fault kind of the regression corpus (``../shared/fault-cases/*.json``, field ``kind``) is a
member, so a corpus case can always be matched to the finding it must produce.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

#: Offending frame text is capped at this many characters in a finding (the audit stores it).
FRAGMENT_CAP = 4096


class Severity(enum.StrEnum):
    """How bad a finding is: ``info`` absorbed silently, ``warning`` repaired, ``error`` fatal to the attempt."""

    INFO = "info"
    WARNING = "warning"
    ERROR = "error"


class Action(enum.StrEnum):
    """What the guard did about a finding."""

    NORMALIZED = "normalized"  # dialect quirk absorbed; the output is canonical
    REPAIRED = "repaired"  # a deterministic, policy-allowed repair changed the call
    IGNORED = "ignored"  # metadata skipped (keep-alive comments, filter annotations)
    RETRY = "retry"  # the attempt is unusable; ask the upstream again
    ERROR = "error"  # a non-retryable upstream error; passed to the client


class FindingKind(enum.StrEnum):
    """Finding kind slugs. The first block is the fault corpus' ``kind`` values, verbatim."""

    # A. tool-call identity, name and index (corpus)
    EMPTY_NAME_ON_CONTINUATION = "empty-name-on-continuation"  # C01
    NAME_REPEATED_EVERY_CHUNK = "name-repeated-every-chunk"  # C03
    NAME_ARRIVES_LATE = "name-arrives-late"  # C05
    NAME_SPLIT_ACROSS_CHUNKS = "name-split-across-chunks"  # C06
    TOOL_CALL_ID_CHANGES_MID_STREAM = "tool-call-id-changes-mid-stream"  # C07
    TOOL_CALL_ID_MISSING = "tool-call-id-missing"  # C08
    PARALLEL_CALLS_SHARE_INDEX_0 = "parallel-calls-share-index-0"  # C09
    TOOL_CALL_INDEX_MISSING = "tool-call-index-missing"  # C10
    TOOL_CALL_TYPE_MISSING = "tool-call-type-missing"  # C12
    # B. arguments (corpus)
    ARGUMENTS_AS_JSON_OBJECT = "arguments-as-json-object"  # C13
    CUMULATIVE_ARGUMENTS_SNAPSHOTS = "cumulative-arguments-snapshots"  # C14
    FULL_ARGUMENTS_RESENT_AT_END = "full-arguments-resent-at-end"  # C15
    SINGLE_CHUNK_COMPLETE_CALL = "single-chunk-complete-call"  # C17
    FINAL_CHUNK_REPEATS_METADATA_WITH_FINISH = "final-chunk-repeats-metadata-with-finish"  # C18
    EMPTY_ARGUMENTS_FOR_NO_ARG_TOOL = "empty-arguments-for-no-arg-tool"  # C19
    NESTED_VALUES_DOUBLE_ENCODED = "nested-values-double-encoded"  # C20
    RAW_CONTROL_CHARACTERS_IN_ARGUMENTS = "raw-control-characters-in-arguments"  # C21
    CODE_FENCE_PREFIX_IN_ARGUMENTS = "code-fence-prefix-in-arguments"  # C23
    TRUNCATED_ARGUMENTS_LENGTH = "truncated-arguments-length"  # C24
    # C. leaked markup (corpus)
    HERMES_TOOL_CALL_TAGS_IN_CONTENT = "hermes-tool-call-tags-in-content"  # C26
    DEEPSEEK_SPECIAL_TOKENS_IN_CONTENT = "deepseek-special-tokens-in-content"  # C27
    KIMI_SECTION_TOKENS_IN_CONTENT = "kimi-section-tokens-in-content"  # C29
    MINIMAX_XML_IN_CONTENT = "minimax-xml-in-content"  # C31
    # D. finish reason (corpus)
    FINISH_REASON_STOP_WITH_TOOL_CALLS = "finish-reason-stop-with-tool-calls"  # C32
    DUPLICATE_TERMINAL_FINISH_REASON = "duplicate-terminal-finish-reason"  # C33
    EMPTY_STRING_FINISH_REASON_AND_LEGACY_STUB = "empty-string-finish-reason-and-legacy-stub"  # C34
    # E. envelope and SSE framing (corpus)
    USAGE_ONLY_CHUNK_EMPTY_CHOICES = "usage-only-chunk-empty-choices"  # C36
    CONTENT_FILTER_ANNOTATION_CHUNKS = "content-filter-annotation-chunks"  # C37
    SSE_DATA_WITHOUT_SPACE = "sse-data-without-space"  # C38
    SSE_COMMENT_KEEPALIVES = "sse-comment-keepalives"  # C40
    MID_STREAM_ERROR_CHUNK = "mid-stream-error-chunk"  # C41
    NONSTANDARD_SSE_ERROR_FIELD = "nonstandard-sse-error-field"  # C43
    FUSED_TRUNCATED_SSE_FRAMES = "fused-truncated-sse-frames"  # C45
    # F. names and pre-stream errors (corpus)
    UNDECLARED_OR_PREFIXED_TOOL_NAME = "undeclared-or-prefixed-tool-name"  # C46
    PRE_STREAM_TOOL_USE_FAILED = "pre-stream-tool-use-failed"  # C47

    # Beyond the corpus: the rest of each family.
    FUNCTION_TAG_MARKUP_IN_CONTENT = "function-tag-markup-in-content"  # <function=name>{...}</function>
    LEAKED_MARKUP_UNPARSEABLE = "leaked-markup-unparseable"
    # Every other dialect of proxy.guard.dialects (docs/dialects.md); the detail names the family.
    TOOL_CALL_MARKUP_IN_CONTENT = "tool-call-markup-in-content"
    # A declared tool named next to call-like syntax that no dialect recognised; left as text.
    UNRECOGNIZED_MARKUP = "unrecognized-markup"
    UNPARSEABLE_DATA_FRAME = "unparseable-data-frame"
    NON_CHUNK_FRAME = "non-chunk-frame"  # JSON that is not a chat.completion.chunk
    COMPLETION_ID_CHANGED = "completion-id-changed"
    IDENTITY_FIELD_BLANK = "identity-field-blank"  # id/model/created empty, null or "null"
    ROLE_REPEATED = "role-repeated"
    STRAY_ESCAPE_IN_ARGUMENTS = "stray-escape-in-arguments"
    ARGUMENTS_NOT_JSON = "arguments-not-json"
    ARGUMENTS_NOT_OBJECT = "arguments-not-object"
    MIXED_ARGUMENT_FRAGMENT_TYPES = "mixed-argument-fragment-types"
    CONFLICTING_DUPLICATE_ARGUMENTS = "conflicting-duplicate-arguments"
    DUPLICATE_TOOL_CALL = "duplicate-tool-call"
    SCHEMA_VIOLATION = "schema-violation"
    TOOL_SCHEMA_INVALID = "tool-schema-invalid"  # the client's own parameters schema is unusable
    # a call over the inline validation budget got no verdict from the validation pool (its worker was
    # killed at the deadline, or died): the call counts as invalid, the attempt is retried
    SCHEMA_VALIDATION_UNFINISHED = "schema-validation-unfinished"
    TOOL_CHOICE_VIOLATION = "tool-choice-violation"
    PARALLEL_TOOL_CALLS_VIOLATION = "parallel-tool-calls-violation"
    MISSING_FINISH_REASON = "missing-finish-reason"
    CONTENT_FILTERED = "content-filtered"
    EOF_WITHOUT_DONE = "eof-without-done"
    EMPTY_TURN = "empty-turn"
    UPSTREAM_HTTP_ERROR = "upstream-http-error"
    UPSTREAM_CONNECTION_ERROR = "upstream-connection-error"
    UPSTREAM_TIMEOUT = "upstream-timeout"
    UPSTREAM_NOT_SSE = "upstream-not-sse"
    UPSTREAM_BODY_TOO_LARGE = "upstream-body-too-large"  # a non-stream answer past its size bound
    OUTBOUND_ADDRESS_REFUSED = "outbound-address-refused"  # the upstream address is refused (SSRF policy)
    CREDENTIAL_REFLECTED = "credential-reflected"  # the upstream echoed toolrelay's credential in an answer
    # A text stream cut by the upstream after text reached the client was continued from exactly that
    # text (a trailing assistant prefix, proxy/guard/decisions/continuation.py); the detail says where.
    TEXT_CONTINUED = "text-continued"
    REQUEST_FIELD_NOT_FORWARDED = "request-field-not-forwarded"  # a client field no upstream field carries
    # The upstream refused a request parameter (an output budget over its range, a field it does not take);
    # the upstream client asked again at once with it clamped or left out (proxy/upstreams/refusals.py).
    UPSTREAM_PARAMETER_REFUSED = "upstream-parameter-refused"
    # Input-side family members (accumulate / sse).
    INTERMEDIATE_FINISH_REASON = "intermediate-finish-reason"  # deltas after a choice's finish_reason
    UNKNOWN_FINISH_REASON = "unknown-finish-reason"  # a finish_reason outside the OpenAI set and aliases
    TOOL_CALL_ID_REPEATED = "tool-call-id-repeated"  # same id re-sent on a continuation delta
    TOOL_CALL_INDEX_GAP = "tool-call-index-gap"  # indexes not 0-based / not contiguous
    GUARD_INTERNAL_ERROR = "guard-internal-error"  # a bug in the guard: the attempt is retried, never passed on
    # Bytes the protocol does not allow (proxy.guard.stream.integrity): retried where they touch a tool call.
    INVALID_UTF8_IN_FRAME = "invalid-utf8-in-frame"  # bytes that are not UTF-8 (decoded as U+FFFD)
    LONE_SURROGATE = "lone-surrogate"  # a \\ud800-\\udfff escape without its pair
    CORRUPTED_KEY = "corrupted-key"  # a key with invalid UTF-8, or one edit away from a known key there
    UNREQUESTED_CHOICE_INDEX = "unrequested-choice-index"  # a choice index >= the request's n
    SSE_LINE_TOO_LONG = "sse-line-too-long"  # an SSE line past MAX_SSE_LINE_BYTES on the guarded path
    # Argument assembly by the schema (proxy.guard.stream.assemble) and envelope tolerance (proxy.guard.envelope).
    ARGUMENTS_ASSEMBLED = "arguments-assembled"  # another assembly than plain concatenation was the valid one
    AMBIGUOUS_ARGUMENTS = "ambiguous-arguments"  # no assembly, or several different ones, valid: retried
    ENVELOPE_VARIANT = "envelope-variant"  # another shape / deprecated field / type variant, normalised
    # The reading rule (proxy.guard.reading, issue 20): a reading other than the plain one was the unique valid one.
    SSE_EVENTS_WITHOUT_BLANK_LINE = "sse-events-without-blank-line"  # framing: one data value, several chunks
    COMPLETION_ID_PER_CHUNK = "completion-id-per-chunk"  # envelope: every chunk an id of its own, one generation
    CHOICE_INDEX_AS_COUNTER = "choice-index-as-counter"  # envelope: 0, 1, 2, ... per chunk on an n=1 stream
    TOOL_NAME_SPECIAL_TOKEN_SUFFIX = "tool-name-special-token-suffix"  # noqa: S105 -- names: a<|channel|>b
    FUSED_PARALLEL_ARGUMENTS = "fused-parallel-arguments"  # arguments: {...}{...} in one slot, several calls
    ARGUMENTS_MISSING_BRACE = "arguments-missing-brace"  # arguments: one structural character missing at an end
    MARKUP_RESIDUE_IN_CONTENT = "markup-residue-in-content"  # text: only template markup left beside calls
    AMBIGUOUS_READING = "ambiguous-reading"  # several readings valid (framing, envelope, names): retried
    # The loop breaker replaced a turn (or an exhaustion answer) with the stuck message (guard/decisions/loops.py).
    AGENT_LOOP = "agent-loop"
    # The tenant's retry budget was spent: a broken answer got no further attempt (proxy/policy/retry_budget.py).
    RETRY_BUDGET_SPENT = "retry-budget-spent"
    # An upstream usage field was no token count (negative, huge, not a whole number): estimated instead
    # (proxy/guard/checks/usage.py).
    USAGE_INVALID = "usage-invalid"
    # A money budget passed its soft threshold (proxy/policy/money.py): the tenant's alert fires once per window.
    MONEY_BUDGET_THRESHOLD = "money-budget-threshold"
    # A session moved to another upstream or key because its own failed (proxy/routing/router.py: the
    # provider's prompt cache starts over); the detail names where from and where to.
    SESSION_MOVED = "session-moved"


@dataclass(frozen=True, slots=True)
class Finding:
    """One anomaly tied to where it was seen.

    ``choice`` / ``slot`` are the choice index and tool-call slot (``None`` when not applicable);
    ``frame`` is the 0-based number of the SSE event in the attempt; ``offset`` the byte offset of
    that event in the attempt body; ``fragment`` the offending frame text (capped at
    ``FRAGMENT_CAP`` characters); ``detail`` a human sentence; ``action`` what was done.
    """

    kind: FindingKind
    severity: Severity
    action: Action
    detail: str = ""
    choice: int | None = None
    slot: int | None = None
    frame: int | None = None
    offset: int | None = None
    fragment: str = ""
    tool: str = ""  # the tool the finding's slot amounts to, filled in at the end of the attempt

    @property
    def fatal(self) -> bool:
        """True when the finding makes the attempt unusable (retry or error)."""
        return self.action in (Action.RETRY, Action.ERROR)


@dataclass(frozen=True, slots=True)
class Where:
    """The frame a delta came from (for findings): 0-based event number, byte offset, raw text."""

    frame: int | None = None
    offset: int | None = None
    raw: str = ""


def cap_fragment(text: str) -> str:
    """Return ``text`` cut to ``FRAGMENT_CAP`` characters, marking the cut."""
    if len(text) <= FRAGMENT_CAP:
        return text
    return text[:FRAGMENT_CAP] + "…[truncated]"
