"""What a request may use, ORM-free: a ``Principal`` (tenant, key, routes, policies, limits) and the
``UpstreamTarget`` / ``RoutePlan`` of one model (``Principal.resolve``). Built by ``tenants.auth``,
carried by the proxy path; frozen, so nothing on the event loop touches a model instance."""

from __future__ import annotations

import dataclasses
import fnmatch
from collections.abc import Iterator
from dataclasses import dataclass, field

from django.conf import settings

from proxy.guard.policy import GuardPolicy
from tenants.learned import LearnedFact
from tenants.limits import Limits


@dataclass(frozen=True, slots=True)
class UpstreamTarget:
    """Where one attempt goes: the upstream (credential still encrypted) and the upstream model name.

    Timeouts in seconds. ``keys``: the credential pool (see the field). ``learned``: what the database
    knows this upstream refuses, every model's
    (``UpstreamLearnedLimit`` rows, expired ones included: an admin's "forget" is one), merged into the
    upstream client's own facts when the target is used.
    """

    upstream_id: int
    name: str
    base_url: str
    model: str
    credential_encrypted: str = field(repr=False)
    extra_headers_encrypted: str = field(repr=False)
    connect_timeout: float
    first_byte_timeout: float
    idle_timeout: float
    request_deadline: float | None = None  # the upstream's own bound on a whole request
    learned: tuple[LearnedFact, ...] = field(default=(), repr=False)
    #: The credential pool: ``(key id, encrypted secret, weight)`` per key, the upstream's own credential
    #: first (id ``"0"``, when set); empty: the one ``credential_encrypted``. ``proxy.routing`` picks one
    #: per attempt and sets ``credential_encrypted`` and ``key_id`` to it.
    keys: tuple[tuple[str, str, int], ...] = field(default=(), repr=False)
    key_id: str = "0"  # the key ``credential_encrypted`` is
    #: How the upstream continues a trailing assistant message (``proxy.guard.decisions.continuation.Shape``
    #: values; "" = it does not).
    continuation: str = ""


@dataclass(frozen=True, slots=True)
class RoutePlan:
    """A resolved model: ``targets[0]`` serves attempt 0, ``targets[k]`` retry k (the last repeats).

    ``deadline``: seconds a whole request may take, the smallest of ``REQUEST_DEADLINE_SECONDS``, the
    route's and every target upstream's own (tenant values can only shorten the server's).
    """

    public_model: str
    route_id: int | None
    targets: tuple[UpstreamTarget, ...]
    max_output_tokens: int | None
    policy: GuardPolicy
    deadline: float = 600.0
    #: The matched route's ``public_name`` as configured (a metrics label); None for the default upstream.
    route_name: str | None = None
    #: How a new session picks among ``targets`` (``ModelRoute.prefer``): ``order`` (the first usable) or
    #: ``quality`` (the lowest live broken-turn rate, ``proxy.routing``).
    prefer: str = "order"
    #: Where the retry of a broken attempt goes (``ModelRoute.retry_target``): ``next`` (the next target,
    #: the last one repeating) or ``same`` (the target that broke it; an upstream error still moves on).
    retry_target: str = "next"
    #: The route opted in to continuing cut text streams (``ModelRoute.continue_text``).
    continue_text: bool = False

    def target(self, attempt: int) -> UpstreamTarget:
        """The target for 0-based ``attempt``: the primary, then fallbacks in order, then the last one again."""
        return self.targets[min(attempt, len(self.targets) - 1)]

    def next_index(self, index: int, *, broken: bool) -> int:
        """The index in ``targets`` of the retry after an attempt on ``targets[index]`` failed (``broken``:
        for broken model output). Broken output: the same target under ``retry_target`` ``same``, else the
        next one, after the last the first again (another target is the point: the one that broke the turn
        is the likeliest to break it again). An upstream error: the next one, the last repeating (a failing
        upstream earlier in the list is not asked again)."""
        count = len(self.targets)
        index = min(max(index, 0), count - 1)
        if broken:
            return index if self.retry_target == "same" else (index + 1) % count
        return min(index + 1, count - 1)

    def attempts(self) -> Iterator[tuple[int, UpstreamTarget]]:
        """``(attempt, target)`` for the first attempt and every retry the policy allows, in order."""
        for attempt in range(1 + self.policy.max_retries):
            yield attempt, self.target(attempt)


@dataclass(frozen=True, slots=True)
class Route:
    """A tenant's model route: ``targets`` are (upstream, upstream model or '' for the requested name),
    enabled upstreams only, primary first."""

    route_id: int
    public_name: str
    is_glob: bool
    targets: tuple[tuple[UpstreamTarget, str], ...]
    max_output_tokens: int | None
    policy: GuardPolicy
    request_deadline: float | None = None
    prefer: str = "order"  # ``RoutePlan.prefer``
    retry_target: str = ""  # ``RoutePlan.retry_target``; "": ``next``
    continue_text: bool = False  # ``ModelRoute.continue_text``

    def matches(self, model: str) -> bool:
        """True when ``model`` is this route's name or matches its glob."""
        return fnmatch.fnmatchcase(model, self.public_name) if self.is_glob else model == self.public_name


@dataclass(frozen=True, slots=True)
class Principal:
    """An authorized API key: what a request needs of its tenant, without the database."""

    tenant_id: int
    slug: str
    active: bool
    api_key_id: int
    routes: tuple[Route, ...]
    default_target: UpstreamTarget | None  # the tenant's default upstream (enabled), model name unset
    policy: GuardPolicy  # the tenant's own policy (routes carry theirs)
    limits: Limits = Limits()  # the tenant's limits (tenants.limits)
    key_limits: Limits = Limits()  # the key's own, within the tenant's
    #: The membership owning the key (``ApiKey.member``), None for a tenant's own key.
    member_id: int | None = None
    member_username: str = ""  # the member's user name (audit snapshot); "" without a member
    #: Model names or globs the member's keys may request (empty: every model; ``allows``).
    member_models: tuple[str, ...] = ()
    member_limits: Limits = Limits()  # the member's own limits, within the tenant's, over all their keys

    def allows(self, model: str) -> bool:
        """True when this key may request ``model`` (a member's ``allowed_models``; always for tenant keys)."""
        return allows_model(self.member_models, model)

    def resolve(self, model: str) -> RoutePlan | None:
        """The plan for ``model``: an exact route, else the most specific matching glob (longest
        pattern), else the tenant's default upstream with the name unchanged, else None."""
        exact = [r for r in self.routes if not r.is_glob and r.public_name == model]
        globs = sorted((r for r in self.routes if r.is_glob and r.matches(model)), key=lambda r: -len(r.public_name))
        matches = exact or globs
        if matches:
            route = matches[0]
            if not route.targets:
                return None
            targets = tuple(dataclasses.replace(t, model=m or model) for t, m in route.targets)
            return RoutePlan(model, route.route_id, targets, route.max_output_tokens, route.policy,
                             _deadline(route.request_deadline, targets), route_name=route.public_name,
                             prefer="quality" if route.prefer == "quality" and len(targets) > 1 else "order",
                             retry_target="same" if route.retry_target == "same" else "next",
                             continue_text=route.continue_text)
        if self.default_target is not None:
            targets = (dataclasses.replace(self.default_target, model=model),)
            return RoutePlan(model, None, targets, None, self.policy, _deadline(None, targets))
        return None

    def model_names(self) -> list[str]:
        """Public model names this tenant routes by exact name (a glob such as ``claude-*`` is no model id;
        names served only by the default upstream are not known here)."""
        return sorted(r.public_name for r in self.routes if not r.is_glob)


def allows_model(patterns: tuple[str, ...], model: str) -> bool:
    """True when ``patterns`` is empty (everything) or ``model`` equals or matches one (``fnmatchcase``)."""
    return not patterns or any(model == p or fnmatch.fnmatchcase(model, p) for p in patterns)


def _deadline(route: float | None, targets: tuple[UpstreamTarget, ...]) -> float:
    """The effective request deadline in seconds (see ``RoutePlan``)."""
    own = [d for d in (route, *(t.request_deadline for t in targets)) if d]
    return min([float(settings.REQUEST_DEADLINE_SECONDS), *own])
