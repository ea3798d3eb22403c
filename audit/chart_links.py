"""Where the dashboard's chart bars and points lead: the admin list of the rows they count.

Each link carries the dashboard's period (or the point's bucket) as the lists' ``created`` date
filter, its tenant, and the filters of the figure (upstream, model, kind, outcome...). Request lists
use the same definitions as ``audit.reports``: a *corrupted* request is a guarded one that ended
``recovered-by-retry`` or ``exhausted``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from urllib.parse import urlencode

from django.urls import reverse

from audit.models import ProxyRequest
from audit.reports import BUCKET_STEPS, CORRUPTED_OUTCOMES, USABLE_OUTCOMES

#: List filters of the requests a corruption figure counts.
CORRUPTED = {"path__exact": ProxyRequest.Path.GUARDED.value, "outcome__in": ",".join(CORRUPTED_OUTCOMES)}
#: List filters of the requests that got a usable answer.
USABLE = {"path__exact": ProxyRequest.Path.GUARDED.value, "outcome__in": ",".join(USABLE_OUTCOMES)}


def _parse(bucket: str) -> datetime:
    return datetime.fromisoformat(bucket.replace("Z", "+00:00")).astimezone(UTC)


@dataclass(frozen=True, slots=True)
class ChartLinks:
    """URLs into the audit admin for a dashboard period ``[since, until)``, bucketed by ``bucket``."""

    since: datetime
    until: datetime
    bucket: str
    tenant_id: int | None = None

    def _query(self, bucket: str | None, filters: dict[str, str | int]) -> str:
        since, until = self.since, self.until
        if bucket is not None:
            since = max(_parse(bucket), self.since)
            until = min(_parse(bucket) + BUCKET_STEPS[self.bucket], self.until)
        query: dict[str, str | int] = {"created__gte": since.isoformat(), "created__lt": until.isoformat()}
        if self.tenant_id is not None:
            query["tenant"] = self.tenant_id
        return urlencode({**query, **filters})

    def requests(self, bucket: str | None = None, **filters: str | int) -> str:
        """The proxy requests list of the period (or of ``bucket``) with ``filters``; every request
        unless the filters say otherwise (``show=all``)."""
        return reverse("admin:audit_proxyrequest_changelist") + "?" + self._query(bucket, {"show": "all", **filters})

    def findings(self, bucket: str | None = None, **filters: str | int) -> str:
        """The findings list of the period (or of ``bucket``) with ``filters``, every severity."""
        return reverse("admin:audit_finding_changelist") + "?" + self._query(bucket, {"severity": "all", **filters})
