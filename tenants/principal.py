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

    Timeouts in seconds. ``learned``: what the database knows this upstream refuses, every model's
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

    def target(self, attempt: int) -> UpstreamTarget:
        """The target for 0-based ``attempt``: the primary, then fallbacks in order, then the last one again."""
        return self.targets[min(attempt, len(self.targets) - 1)]

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
                             _deadline(route.request_deadline, targets), route_name=route.public_name)
        if self.default_target is not None:
            targets = (dataclasses.replace(self.default_target, model=model),)
            return RoutePlan(model, None, targets, None, self.policy, _deadline(None, targets))
        return None

    def model_names(self) -> list[str]:
        """Public model names this tenant routes by exact name (a glob such as ``claude-*`` is no model id;
        names served only by the default upstream are not known here)."""
        return sorted(r.public_name for r in self.routes if not r.is_glob)


def _deadline(route: float | None, targets: tuple[UpstreamTarget, ...]) -> float:
    """The effective request deadline in seconds (see ``RoutePlan``)."""
    own = [d for d in (route, *(t.request_deadline for t in targets)) if d]
    return min([float(settings.REQUEST_DEADLINE_SECONDS), *own])
