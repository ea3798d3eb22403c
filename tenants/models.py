"""Tenants and what they own: API keys, upstreams, model routes, memberships, guard policy.

Tenant-owned rows are read through ``tenants.selectors`` (the one door) and written through
``tenants.services``; models hold single-row invariants and formatting only (STYLE.md rule 7).
"""

from __future__ import annotations

import fnmatch
import hashlib
import hmac
import json
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.utils import timezone

from infra import headers as reserved_headers
from infra import outbound
from proxy.guard.policy import DETERMINISTIC_REPAIRS, Exhaustion, FragmentStorage, GuardPolicy, Repair
from tenants import crypto
from tenants.limits import Limits, above_tenant
from tenants.principal import allows_model

API_KEY_PREFIX = "tr"


#: RFC 9110 section 5.1: a header name is a token.
_TOKEN_CHARS = frozenset("!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")


def validate_header_value(value: str, *, what: str = "The value") -> None:
    """Refuse what cannot go into an HTTP header as given (RFC 9110 section 5.5): CR, LF, NUL or any
    other control character, and surrounding whitespace (httpx refuses these with an error that
    quotes the value, i.e. the secret). Raises ``ValidationError``."""
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in value):
        raise ValidationError(f"{what} contains a line break or another control character.")
    if value != value.strip():
        raise ValidationError(f"{what} starts or ends with whitespace.")


def validate_header_name(name: str) -> None:
    """A header name must be a non-empty token (RFC 9110 section 5.1). Raises ``ValidationError``."""
    if not name or any(ch not in _TOKEN_CHARS for ch in name):
        raise ValidationError(f"{name[:40]!r} is not a valid header name.")


def validate_extra_headers(headers: dict[str, str]) -> None:
    """Every name a token and not reserved (``infra.headers``: ``x-toolrelay-*``, hop-by-hop and framing
    headers, ``Host``, ``Authorization`` / ``x-api-key``), every value a valid header value (values are
    not quoted in the error). Raises ``ValidationError``."""
    for name, value in headers.items():
        validate_header_name(name)
        if reserved_headers.reserved(name):
            raise ValidationError(
                f"{name[:40]!r} is reserved: toolrelay sets its own x-toolrelay-* headers, the hop-by-hop and "
                "framing headers (Connection, Keep-Alive, Transfer-Encoding, Content-Length, TE, Trailer, "
                "Upgrade, Proxy-*) and Host; the credential goes in its own field, not in Authorization or "
                "x-api-key.")
        validate_header_value(value, what=f"The value of header {name!r}")


def validate_outbound_url(url: str) -> None:
    """The outbound address policy at save time (``infra.outbound.check_url``). Raises ``ValidationError``."""
    try:
        outbound.check_url(url)
    except outbound.OutboundRefused as exc:
        where = f"{exc.address} is " if exc.address else ""
        raise ValidationError(f"Refused by the outbound address policy: {where}{exc.reason}. toolrelay connects "
                              "only to public addresses unless the operator allows a network "
                              "(UPSTREAM_ALLOW_NETWORKS).") from None


def _default_repairs() -> list[str]:
    return sorted(r.value for r in DETERMINISTIC_REPAIRS)


class PolicyFields(models.Model):
    """Guard policy columns; on Tenant they are the defaults, on ModelRoute nullable overrides."""

    max_retries = models.PositiveSmallIntegerField(null=True, blank=True,
                                                   help_text="Upstream retries after the first attempt.")
    stream_text = models.BooleanField(null=True, blank=True, help_text="Stream text live in guarded requests.")
    early_abort = models.BooleanField(null=True, blank=True,
                                      help_text="Stop reading a provably broken attempt at once.")
    exhaustion = models.CharField(
        max_length=16, choices=[(e.value, e.value) for e in Exhaustion], blank=True,
        help_text=("How a turn toolrelay gives up on ends (docs/clients.md): fail = the protocol's terminal "
                   "error (headless agents exit with a failure), message = a terminal assistant message, "
                   "error = a retryable in-stream error."))
    allowed_repairs = models.JSONField(
        null=True, blank=True, help_text=f"List of allowed repairs among: {', '.join(r.value for r in Repair)}.")
    fragment_storage = models.CharField(max_length=16, choices=[(f.value, f.value) for f in FragmentStorage],
                                        blank=True, help_text="How much raw upstream body the audit keeps.")
    retention_days = models.PositiveIntegerField(null=True, blank=True, help_text="Days raw fragments are kept.")
    loop_breaker = models.BooleanField(null=True, blank=True,
                                       help_text="Stop an agent repeating tool calls with the same results.")
    loop_repeats = models.PositiveSmallIntegerField(
        null=True, blank=True, help_text="The delivery of one identical call that is stopped (4: the 4th in a row).")
    loop_cycle_repeats = models.PositiveSmallIntegerField(
        null=True, blank=True, help_text="The repetition of a cycle of 2 or 3 calls that is stopped.")
    loop_exhausted_turns = models.PositiveSmallIntegerField(
        null=True, blank=True, help_text="Exhausted turns in a row after which the agent is told it seems stuck.")
    loop_exempt_tools = models.JSONField(null=True, blank=True,
                                         help_text="List of tool names the loop breaker never counts (polling tools).")
    retry_budget_percent = models.PositiveSmallIntegerField(
        null=True, blank=True, help_text="Retries for broken output may add at most this % to the tenant's upstream "
                                         "calls over 10 minutes (tenant-wide; set on the tenant).")
    trace_content = models.BooleanField(null=True, blank=True,
                                        help_text="OpenTelemetry traces carry finding details and the delivered turn "
                                                  "(scrubbed); off: no content in traces.")

    class Meta:
        abstract = True

    POLICY_FIELDS = ("max_retries", "stream_text", "early_abort", "exhaustion", "allowed_repairs",
                     "fragment_storage", "retention_days", "loop_breaker", "loop_repeats", "loop_cycle_repeats",
                     "loop_exhausted_turns", "loop_exempt_tools", "retry_budget_percent", "trace_content")

    def policy_overrides(self) -> dict[str, Any]:
        """The policy values set on this row (None / blank = inherit)."""
        values = {name: getattr(self, name) for name in self.POLICY_FIELDS}
        return {k: v for k, v in values.items() if v is not None and v != ""}


class LimitFields(models.Model):
    """Limit columns (``tenants.limits.Limits``): None = no limit, 0 = blocked. A key's apply within
    its tenant's and may not exceed them (``ApiKey.clean``, ``tenants.services.limits_set``)."""

    rpm = models.PositiveIntegerField("requests per minute", null=True, blank=True,
                                      help_text="Requests per minute (empty: no limit; 0 blocks).")
    tpm = models.PositiveIntegerField("tokens per minute", null=True, blank=True,
                                      help_text="Input + output tokens per minute (estimated before the answer, "
                                                "corrected from its usage).")
    concurrency = models.PositiveIntegerField("concurrent requests", null=True, blank=True,
                                              help_text="Requests in flight at once; more wait briefly, then 429.")
    daily_tokens = models.PositiveBigIntegerField("tokens per day", null=True, blank=True,
                                                  help_text="Tokens per UTC day; spent: 429 insufficient_quota.")
    monthly_tokens = models.PositiveBigIntegerField("tokens per month", null=True, blank=True,
                                                    help_text="Tokens per UTC calendar month.")
    daily_usd = models.DecimalField("USD per day", max_digits=16, decimal_places=6, null=True, blank=True,
                                    validators=[MinValueValidator(0)],
                                    help_text="Money budget per UTC day, at the prices in force (docs/money.md).")
    weekly_usd = models.DecimalField("USD per week", max_digits=16, decimal_places=6, null=True, blank=True,
                                     validators=[MinValueValidator(0)], help_text="Per ISO week (from Monday, UTC).")
    monthly_usd = models.DecimalField("USD per month", max_digits=16, decimal_places=6, null=True, blank=True,
                                      validators=[MinValueValidator(0)], help_text="Per UTC calendar month.")
    money_soft_percent = models.PositiveSmallIntegerField(
        "soft threshold (%)", null=True, blank=True, validators=[MinValueValidator(1), MaxValueValidator(100)],
        help_text="Percent of each money budget above past which the tenant's alert webhooks and the live feed are "
                  "told, once per budget and period (empty: MONEY_SOFT_PERCENT, 80).")
    daily_usd_soft_percent = models.PositiveSmallIntegerField(
        "daily soft threshold (%)", null=True, blank=True, validators=[MinValueValidator(1), MaxValueValidator(100)],
        help_text="The daily budget's own soft threshold (empty: the soft threshold above).")
    weekly_usd_soft_percent = models.PositiveSmallIntegerField(
        "weekly soft threshold (%)", null=True, blank=True, validators=[MinValueValidator(1), MaxValueValidator(100)],
        help_text="The weekly budget's own soft threshold (empty: the soft threshold above).")
    monthly_usd_soft_percent = models.PositiveSmallIntegerField(
        "monthly soft threshold (%)", null=True, blank=True,
        validators=[MinValueValidator(1), MaxValueValidator(100)],
        help_text="The monthly budget's own soft threshold (empty: the soft threshold above).")

    class Meta:
        abstract = True

    def limits(self) -> Limits:
        """These columns as ``Limits``."""
        return Limits.of(self)


class Tenant(PolicyFields, LimitFields):
    """An organisation using the proxy; owns keys, upstreams and routes, and the default guard policy."""

    name = models.CharField(max_length=100, unique=True)
    slug = models.SlugField(max_length=100, unique=True)
    active = models.BooleanField(default=True)
    created = models.DateTimeField(default=timezone.now, editable=False)
    default_upstream = models.ForeignKey("Upstream", null=True, blank=True, on_delete=models.SET_NULL,
                                         related_name="+", help_text="Serves model names no route matches, unchanged.")

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        """The default upstream must be one of this tenant's own (its credential is the tenant's)."""
        upstream = self.default_upstream if self.default_upstream_id else None
        if upstream is not None and self.pk and upstream.tenant_id != self.pk:
            raise ValidationError({"default_upstream": "Choose one of this tenant's upstreams."})

    def policy(self, overrides: dict[str, Any] | None = None) -> GuardPolicy:
        """The effective GuardPolicy: product defaults < tenant values < ``overrides`` (a route's)."""
        values = {**self.policy_overrides(), **(overrides or {})}
        base = GuardPolicy()
        repairs = values.get("allowed_repairs")
        exempt = values.get("loop_exempt_tools")
        return GuardPolicy(
            max_retries=values.get("max_retries", base.max_retries),
            stream_text=values.get("stream_text", base.stream_text),
            early_abort=values.get("early_abort", base.early_abort),
            exhaustion=Exhaustion(values.get("exhaustion", base.exhaustion)),
            repairs=frozenset(Repair(r) for r in repairs if r in Repair._value2member_map_)
            if isinstance(repairs, list) else base.repairs,
            fragments=FragmentStorage(values.get("fragment_storage", base.fragments)),
            retention_days=values.get("retention_days", base.retention_days),
            loop_breaker=values.get("loop_breaker", base.loop_breaker),
            loop_repeats=values.get("loop_repeats", base.loop_repeats),
            loop_cycle_repeats=values.get("loop_cycle_repeats", base.loop_cycle_repeats),
            loop_exhausted_turns=values.get("loop_exhausted_turns", base.loop_exhausted_turns),
            loop_exempt_tools=frozenset(str(t) for t in exempt) if isinstance(exempt, list) else base.loop_exempt_tools,
            retry_budget_percent=values.get("retry_budget_percent", base.retry_budget_percent),
            trace_content=values.get("trace_content", base.trace_content),
        )


def revoke_member_keys(collector: Any, field: Any, sub_objs: Any, using: str) -> None:
    """``on_delete`` of ``ApiKey.member``: a deleted membership's keys stay (the audit points at them), unlinked
    and revoked now; every process is told (``tenants.revocation``) once the delete commits."""
    from tenants import revocation

    live = sub_objs.filter(revoked_at__isnull=True)
    for digest in list(live.values_list("digest", flat=True)):
        revocation.key_revoked(digest)
    # Revoke before unlinking: both updates run in this order, and ``live`` selects by member.
    collector.add_field_update(field.model._meta.get_field("revoked_at"), timezone.now(), live)
    collector.add_field_update(field, None, sub_objs)


revoke_member_keys.lazy_sub_objs = True  # type: ignore[attr-defined]


class ApiKeyQuerySet(models.QuerySet["ApiKey"]):
    def active(self) -> ApiKeyQuerySet:
        """Keys neither revoked nor expired."""
        now = timezone.now()
        return self.filter(revoked_at__isnull=True).filter(models.Q(expires__isnull=True) | models.Q(expires__gt=now))

    def for_tenant(self, tenant: Tenant) -> ApiKeyQuerySet:
        return self.filter(tenant=tenant)


class ApiKey(LimitFields):
    """A virtual key. Only a visible ``prefix`` and a keyed ``digest`` are stored, never the secret.

    Format ``tr-<prefix>-<secret>``: ``prefix`` 12 lowercase alphanumerics (the lookup key),
    ``secret`` 43 urlsafe characters (256 bits). ``digest`` = hex HMAC-SHA256(server secret, full key).
    """

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="api_keys")
    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=16, unique=True, editable=False)
    digest = models.CharField(max_length=64, editable=False)
    created = models.DateTimeField(default=timezone.now, editable=False)
    last_used = models.DateTimeField(null=True, blank=True, editable=False)
    expires = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    member = models.ForeignKey("Membership", null=True, blank=True, on_delete=revoke_member_keys,
                               related_name="api_keys",
                               help_text="The person whose key this is (blank: the tenant's own key). Deleting the "
                                         "membership revokes the key.")

    objects = ApiKeyQuerySet.as_manager()

    class Meta:
        ordering = ["-created"]
        verbose_name = "API key"

    def __str__(self) -> str:
        return f"{self.name} ({self.display})"

    @property
    def display(self) -> str:
        """What may be shown of the key: ``tr-<prefix>-…``."""
        return f"{API_KEY_PREFIX}-{self.prefix}-…"

    def is_usable(self, now: Any = None) -> bool:
        """True when not revoked and not expired."""
        now = now or timezone.now()
        return self.revoked_at is None and (self.expires is None or self.expires > now)

    @staticmethod
    def compute_digest(raw_key: str) -> str:
        """Hex HMAC-SHA256 of ``raw_key`` under the server's API key secret."""
        secret = settings.API_KEY_SECRET or f"toolrelay-api-keys:{settings.SECRET_KEY}"
        return hmac.new(secret.encode(), raw_key.encode(), hashlib.sha256).hexdigest()

    def matches(self, raw_key: str) -> bool:
        """Constant-time comparison of ``raw_key``'s digest with the stored one."""
        return hmac.compare_digest(self.digest, self.compute_digest(raw_key))

    def clean(self) -> None:
        """A key limit above its tenant's is refused (the key could never use it)."""
        if not self.tenant_id:
            return
        if self.member_id and self.member is not None and self.member.tenant_id != self.tenant_id:
            raise ValidationError({"member": "Choose a member of the key's tenant."})
        over = above_tenant(self.limits(), self.tenant.limits())
        if over:
            raise ValidationError({name: f"Above the tenant's limit ({getattr(self.tenant, name)})." for name in over})


class Upstream(models.Model):
    """An OpenAI-compatible chat-completions API of a tenant, with its encrypted credential.

    Timeouts in seconds: ``connect_timeout`` (TCP/TLS), ``first_byte_timeout`` (request sent ->
    response headers and first body byte), ``idle_timeout`` (between two stream reads).
    """

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="upstreams")
    name = models.CharField(max_length=100)
    base_url = models.URLField(max_length=500, help_text="OpenAI-style base, e.g. https://api.deepseek.com/v1")
    credential_encrypted = models.TextField(blank=True, editable=False)
    credential_hint = models.CharField(max_length=24, blank=True, editable=False)
    extra_headers_encrypted = models.TextField(blank=True, editable=False)
    connect_timeout = models.FloatField(default=10.0, validators=[MinValueValidator(0.1)])
    first_byte_timeout = models.FloatField(default=120.0, validators=[MinValueValidator(0.1)])
    idle_timeout = models.FloatField(default=120.0, validators=[MinValueValidator(0.1)])
    request_deadline = models.FloatField(
        null=True, blank=True, validators=[MinValueValidator(1.0)],
        help_text="Longest a whole request through this upstream may take, in seconds (blank: the server's "
                  "REQUEST_DEADLINE_SECONDS; a value can only shorten it).")
    text_continuation = models.CharField(
        max_length=32, blank=True, default="", choices=[
            ("", "none"), ("deepseek-prefix", "DeepSeek prefix completion (beta base URL)"),
            ("continue-final-message", "vLLM / SGLang continue_final_message")],
        help_text="How this upstream continues a trailing assistant message (a cut text stream is continued "
                  "from what the client has, on routes with continue_text on; docs/routing.md).")
    enabled = models.BooleanField(default=True)
    created = models.DateTimeField(default=timezone.now, editable=False)

    class Meta:
        ordering = ["tenant__name", "name"]
        constraints = [models.UniqueConstraint(fields=["tenant", "name"], name="upstream_unique_name_per_tenant")]

    def __str__(self) -> str:
        return f"{self.name} ({self.display_url})"

    def clean(self) -> None:
        """The base URL must pass the outbound address policy (no internal addresses, no userinfo)."""
        if self.base_url:
            try:
                validate_outbound_url(self.base_url)
            except ValidationError as exc:
                raise ValidationError({"base_url": exc.messages}) from None

    @property
    def display_url(self) -> str:
        """The base URL as it may be shown: never a ``user:pass@`` (rows saved before it was refused)."""
        return outbound.safe_url(self.base_url) if "@" in self.base_url else self.base_url

    @property
    def credential_display(self) -> str:
        """Masked credential, e.g. ``sk-…3f9a``; empty when none is set."""
        return self.credential_hint

    def set_credential(self, raw: str) -> None:
        """Encrypt and store ``raw`` (empty clears it); keeps only a masked hint in clear. Validate it
        first with ``validate_header_value`` (it goes into ``Authorization``)."""
        self.credential_encrypted = crypto.encrypt(raw) if raw else ""
        self.credential_hint = _mask(raw)

    def credential(self) -> str:
        """The decrypted credential ('' when none). Raises ``crypto.CredentialError``."""
        return crypto.decrypt(self.credential_encrypted) if self.credential_encrypted else ""

    def set_extra_headers(self, headers: dict[str, str]) -> None:
        """Encrypt and store extra request headers (treated as secrets too)."""
        self.extra_headers_encrypted = crypto.encrypt(json.dumps(headers)) if headers else ""

    def extra_headers(self) -> dict[str, str]:
        """The decrypted extra headers."""
        return json.loads(crypto.decrypt(self.extra_headers_encrypted)) if self.extra_headers_encrypted else {}


class UpstreamCredential(models.Model):
    """One more key of an upstream's credential pool (``docs/routing.md``); the upstream's own credential
    (``Upstream.credential_encrypted``) is the pool's first key, id ``"0"``. ``weight``: its share of new
    requests among the healthy keys. Cool-downs and disabling live in the shared state
    (``proxy.routing``), not here: ``enabled`` is the operator's switch."""

    upstream = models.ForeignKey(Upstream, on_delete=models.CASCADE, related_name="credentials")
    secret_encrypted = models.TextField(editable=False)
    hint = models.CharField(max_length=24, blank=True, editable=False)
    #: Hex SHA-256 of the key, to add a key only once (``upstreams add``); never shown.
    fingerprint = models.CharField(max_length=64, editable=False)
    weight = models.PositiveSmallIntegerField(default=1, validators=[MinValueValidator(1)],
                                              help_text="Share of requests among the healthy keys.")
    enabled = models.BooleanField(default=True)
    created = models.DateTimeField(default=timezone.now, editable=False)

    class Meta:
        ordering = ["upstream", "pk"]
        constraints = [models.UniqueConstraint(fields=["upstream", "fingerprint"], name="credential_unique_key")]

    def __str__(self) -> str:
        return f"{self.upstream.name} key {self.key_id} ({self.hint})"

    @property
    def key_id(self) -> str:
        """The key's id in the pool (``"0"`` is the upstream's own credential)."""
        return str(self.pk)

    @staticmethod
    def fingerprint_of(raw: str) -> str:
        """Hex SHA-256 of ``raw``."""
        return hashlib.sha256(raw.encode()).hexdigest()

    def set_secret(self, raw: str) -> None:
        """Encrypt and store ``raw`` (validate it first with ``validate_header_value``)."""
        self.secret_encrypted = crypto.encrypt(raw)
        self.hint = _mask(raw)
        self.fingerprint = self.fingerprint_of(raw)


def _mask(raw: str) -> str:
    if not raw:
        return ""
    if len(raw) < 12:
        return "…" + raw[-2:]
    head = raw.split("-", 1)[0] + "-" if "-" in raw[:6] else raw[:2]
    return f"{head}…{raw[-4:]}"


class ModelRoute(PolicyFields):
    """Maps a public model name (exact, or a glob such as ``deepseek-*``) to an upstream model.

    ``upstream_model`` blank = the public name unchanged. ``max_output_tokens`` caps the client's
    ``max_tokens`` / ``max_completion_tokens`` (Claude Code asks for 32k-128k). Policy columns
    override the tenant's. Fallbacks (``RouteFallback``) are where retries k = 1, 2, … go.
    """

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="routes")
    public_name = models.CharField(max_length=200, help_text="Exact model name or a glob such as deepseek-*")
    upstream = models.ForeignKey(Upstream, on_delete=models.CASCADE, related_name="routes")
    upstream_model = models.CharField(max_length=200, blank=True)
    max_output_tokens = models.PositiveIntegerField(null=True, blank=True)
    request_deadline = models.FloatField(
        null=True, blank=True, validators=[MinValueValidator(1.0)],
        help_text="Longest a whole request on this route may take, in seconds (blank: the upstream's or the "
                  "server's; a value can only shorten them).")
    prefer = models.CharField(
        max_length=8, default="order", choices=[("order", "order"), ("quality", "quality")],
        help_text="How a new session picks among the route's targets (the upstream, then the fallbacks): the "
                  "first usable one, or the one with the lowest live broken-turn rate (docs/routing.md).")
    retry_target = models.CharField(
        max_length=8, blank=True, default="", choices=[("", "default (next)"), ("next", "next"), ("same", "same")],
        help_text="Where the retry of a broken tool turn goes: the next target, or the same one.")
    continue_text = models.BooleanField(
        default=False,
        help_text="Continue a text stream the upstream cuts after text reached the client, from exactly that "
                  "text, when the upstream takes a prefix (its text continuation); off: the in-stream error.")
    created = models.DateTimeField(default=timezone.now, editable=False)

    class Meta:
        ordering = ["tenant__name", "public_name"]
        constraints = [models.UniqueConstraint(fields=["tenant", "public_name"], name="route_unique_name_per_tenant")]

    def __str__(self) -> str:
        return f"{self.public_name} -> {self.upstream.name}:{self.upstream_model or self.public_name}"

    def clean(self) -> None:
        """A route may only send traffic to an upstream of its own tenant (whose credential it uses)."""
        if self.upstream_id and self.tenant_id and self.upstream.tenant_id != self.tenant_id:
            raise ValidationError({"upstream": "Choose an upstream of the route's tenant."})

    @property
    def is_glob(self) -> bool:
        return any(ch in self.public_name for ch in "*?[")

    def matches(self, model: str) -> bool:
        """True when ``model`` is this route's name, or matches its glob (case-sensitive)."""
        return model == self.public_name or (self.is_glob and fnmatch.fnmatchcase(model, self.public_name))

    def target_model(self, model: str) -> str:
        """The upstream model name for a client's ``model``."""
        return self.upstream_model or model


class RouteFallback(models.Model):
    """The k-th fallback of a route: retry k goes to ``upstream`` with ``model`` (blank = route's)."""

    route = models.ForeignKey(ModelRoute, on_delete=models.CASCADE, related_name="fallbacks")
    position = models.PositiveSmallIntegerField(default=1)
    upstream = models.ForeignKey(Upstream, on_delete=models.CASCADE, related_name="+")
    model = models.CharField(max_length=200, blank=True)

    class Meta:
        ordering = ["position"]

    def __str__(self) -> str:
        return f"#{self.position} {self.upstream.name}:{self.model or '(same)'}"

    def clean(self) -> None:
        """A fallback may only use an upstream of the route's tenant."""
        try:
            route = self.route  # an admin inline sets the (maybe unsaved) route object before clean()
        except ModelRoute.DoesNotExist:
            return
        if self.upstream_id and route.tenant_id and self.upstream.tenant_id != route.tenant_id:
            raise ValidationError({"upstream": "Choose an upstream of the route's tenant."})


class Membership(LimitFields):
    """Binds a user to a tenant: ``admin`` manages it, ``viewer`` only reads (both staff, in the admin),
    ``member`` is a person of the tenant who only manages their own keys (``/account/keys/``).

    Every role may own keys (``ApiKey.member``): at most ``max_keys`` usable ones, serving only the
    models ``allowed_models`` names (exact names or globs such as ``deepseek-*``; empty: every model
    of the tenant). The limit columns are the member's own, within the tenant's, summed over their keys.
    """

    ADMIN = "admin"
    VIEWER = "viewer"
    MEMBER = "member"
    #: Roles that see the tenant in the admin, dashboard and usage pages (``tenants.selectors``).
    STAFF_ROLES = (ADMIN, VIEWER)

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=8, choices=[(ADMIN, "admin"), (VIEWER, "viewer"), (MEMBER, "member")],
                            default=VIEWER)
    max_keys = models.PositiveSmallIntegerField(
        default=5, help_text="Usable keys this person may hold at once (0: may create none).")
    allowed_models = models.JSONField(
        default=list, blank=True,
        help_text='Model names or globs this person\'s keys may use, e.g. ["deepseek-*", "glm-4.6"] '
                  "(empty: every model of the tenant).")
    created = models.DateTimeField(default=timezone.now, editable=False)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["user", "tenant"], name="membership_unique")]

    def __str__(self) -> str:
        return f"{self.user} @ {self.tenant} ({self.role})"

    def clean(self) -> None:
        """``allowed_models`` is a list of at most 100 names (each 1-200 characters); limits fit the tenant's."""
        models_ = self.allowed_models
        if models_ is None:
            self.allowed_models = models_ = []
        if (not isinstance(models_, list) or len(models_) > 100
                or any(not isinstance(m, str) or not m.strip() or len(m) > 200 for m in models_)):
            raise ValidationError({"allowed_models": "A list of up to 100 model names or globs (1-200 characters)."})
        self.allowed_models = [m.strip() for m in models_]
        if self.tenant_id:
            over = above_tenant(self.limits(), self.tenant.limits())
            if over:
                raise ValidationError({n: f"Above the tenant's limit ({getattr(self.tenant, n)})." for n in over})

    def allows(self, model: str) -> bool:
        """True when this person's keys may request ``model`` (see ``allowed_models``)."""
        return allows_model(tuple(self.allowed_models or ()), model)


class UpstreamLearnedLimit(models.Model):
    """What an upstream was learned to refuse for one model, from its own error (``proxy.upstreams.learned``):
    ``parameter`` at most ``value``, or left out when ``value`` is blank.

    Rows are written by the journal writer (from what a proxy process learned) and by the admin (an
    edit is stamped ``learned_at`` = now, so it wins over what processes learned before it); the
    proxy never reads them on the request path: principals carry them (``tenants.auth``). A row
    past ``expires_at`` no longer applies (the next request asks for what the client wanted again);
    "forget" is an expiry set to now.
    """

    upstream = models.ForeignKey(Upstream, on_delete=models.CASCADE, related_name="learned_limits")
    model = models.CharField(max_length=200, help_text="The upstream model name the fact is about.")
    parameter = models.CharField(
        max_length=100, help_text="The request field (max_tokens stands for the output budget, also "
                                  "max_completion_tokens); tool_choice=<class> for one kind of tool_choice value.")
    value = models.PositiveIntegerField(
        null=True, blank=True, help_text="The largest value sent upstream. Blank: the parameter is left out.")
    detail = models.TextField(blank=True, help_text="What the upstream said when it refused.")
    learned_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField(help_text="After this the parameter is sent as the client asked again.")

    class Meta:
        ordering = ["upstream__name", "model", "parameter"]
        constraints = [models.UniqueConstraint(fields=["upstream", "model", "parameter"],
                                               name="learned_limit_unique")]
        verbose_name = "learned upstream limit"

    def __str__(self) -> str:
        return f"{self.upstream.name}:{self.model} {self.describe()}"

    def describe(self) -> str:
        """``max_tokens <= 8192`` or ``stream_options left out``."""
        return f"{self.parameter} <= {self.value}" if self.value is not None else f"{self.parameter} left out"

    def is_live(self, now: Any = None) -> bool:
        """True until ``expires_at``."""
        return self.expires_at > (now or timezone.now())

    def fact(self) -> Any:
        """The row as a ``tenants.learned.LearnedFact`` (what principals carry)."""
        from tenants.learned import LearnedFact

        return LearnedFact(self.upstream_id, self.model, self.parameter, self.value, self.learned_at.timestamp(),
                           self.expires_at.timestamp(), self.detail)


class OidcIdentity(models.Model):
    """The single sign-on subject (the identity provider's ``sub`` claim) a user signs in as
    (``tenants.oidc``). Users are matched on it, never on an e-mail address: an identity provider's
    user cannot take over an account by giving itself that account's address (issue 24 item 5)."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="oidc_identity")
    subject = models.CharField(max_length=255, unique=True, help_text="The identity provider's `sub` claim.")
    created = models.DateTimeField(default=timezone.now, editable=False)

    class Meta:
        verbose_name = "single sign-on identity"

    def __str__(self) -> str:
        return f"{self.user} = {self.subject}"
