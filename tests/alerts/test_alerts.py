"""Tenant alert webhooks: rules over the audit rows, signed posts to a real receiver on loopback (through the
outbound address policy), Celery's retries with backoff after a 500, the delivery log, the admin's test button,
and tenant scoping.

No broker in tests: Celery runs the tasks eagerly in a background thread (``OffThreadEagerTask``), so these
tests use real transactions and wait for the delivery row to settle.
"""

from __future__ import annotations

import http.server
import io
import json
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.core.management import call_command
from django.utils import timezone
from django_celery_beat.models import PeriodicTask

from alerts.models import AlertDelivery, AlertWebhook
from alerts.tasks import alert_deliver_task, alert_test, alerts_evaluate
from alerts.ticker import tick
from audit.models import Finding, ProxyRequest
from infra import webhook
from tests.conftest import TenantWorld

pytestmark = pytest.mark.django_db(transaction=True)

SECRET = "whsec-test-secret-0123456789"


class Receiver(http.server.BaseHTTPRequestHandler):
    """Answers the statuses in ``Receiver.answers`` in turn (then 200) and records every request."""

    answers: list[int] = []
    seen: list[tuple[dict[str, str], bytes]] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        body = self.rfile.read(int(self.headers.get("content-length") or 0))
        Receiver.seen.append((dict(self.headers.items()), body))
        status = Receiver.answers.pop(0) if Receiver.answers else 200
        self.send_response(status)
        self.send_header("content-length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's signature
        return None


@pytest.fixture
def receiver(settings: Any) -> Iterator[str]:
    """A real HTTP server on 127.0.0.1, allowed through the outbound address policy; yields its URL."""
    Receiver.answers, Receiver.seen = [], []
    settings.UPSTREAM_ALLOW_NETWORKS = ["127.0.0.1/32"]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/alerts"
    server.shutdown()
    server.server_close()


@pytest.fixture(autouse=True)
def _fast_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    """The eager retry waits ``retry_backoff * 2**n`` (jittered); a hundredth of a second here."""
    monkeypatch.setattr(alert_deliver_task, "retry_backoff", 0.01)


def make_hook(world: TenantWorld, url: str, **fields: Any) -> AlertWebhook:
    hook = AlertWebhook(tenant=world.tenant, name=fields.pop("name", "ops"), url=url, **fields)
    hook.secret_encrypted = _encrypt(SECRET)
    hook.full_clean()
    hook.save()
    return hook


def _encrypt(secret: str) -> str:
    from tenants import crypto

    return crypto.encrypt(secret)


def settled(delivery_id: int, timeout: float = 10.0) -> AlertDelivery:
    """The delivery once it is no longer pending (the eager task runs in a thread)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        row = AlertDelivery.objects.get(pk=delivery_id)
        if row.status != AlertDelivery.Status.PENDING:
            return row
        time.sleep(0.02)
    raise AssertionError(f"delivery {delivery_id} still pending after {timeout} s")


def requests(world: TenantWorld, *outcomes: str, minutes_ago: float = 1.0) -> None:
    when = timezone.now() - timedelta(minutes=minutes_ago)
    ProxyRequest.objects.bulk_create([
        ProxyRequest(id=uuid.uuid4(), tenant=world.tenant, upstream=world.upstream, model="m", path="guarded",
                     outcome=outcome, attempts=2, created=when) for outcome in outcomes])


def test_the_test_alert_reaches_the_receiver_signed_after_a_500(world_a: TenantWorld, receiver: str) -> None:
    """The receiver fails once with a 500: Celery retries; the second post is taken, with a valid signature
    over the exact body, in the generic format; the delivery log says delivered after 2 attempts."""
    Receiver.answers = [500]
    hook = make_hook(world_a, receiver, format="generic")
    delivery = settled(alert_test(webhook=hook).pk)
    assert (delivery.status, delivery.attempts, delivery.response_status) == ("delivered", 2, 200)
    assert len(Receiver.seen) == 2
    head, body = Receiver.seen[-1]
    assert webhook.verify(SECRET, body, head["X-Toolrelay-Signature"])
    assert not webhook.verify("another-secret-0123456789", body, head["X-Toolrelay-Signature"])
    alert = json.loads(body)
    assert (alert["rule"], alert["tenant"], alert["toolrelay"]) == ("test", "tenant-a", "alert/1")
    assert head["X-Toolrelay-Event"] == "test"


def test_a_receiver_that_keeps_failing_ends_in_a_failed_delivery(world_a: TenantWorld, receiver: str) -> None:
    """Every answer a 503: retried up to the limit, then marked failed with the last answer."""
    Receiver.answers = [503] * 20
    hook = make_hook(world_a, receiver)
    delivery = settled(alert_test(webhook=hook).pk, timeout=20)
    assert delivery.status == "failed" and "HTTP 503" in delivery.error
    assert delivery.attempts == len(Receiver.seen) == 1 + alert_deliver_task.max_retries


def test_the_url_is_checked_by_the_outbound_policy_when_saved_and_when_sent(world_a: TenantWorld,
                                                                           receiver: str, settings: Any) -> None:
    """A loopback URL is refused at save time unless the operator allows the network; one saved while it was
    allowed is refused at connect time after the allowance is gone (nothing reaches the receiver)."""
    hook = make_hook(world_a, receiver)
    settings.UPSTREAM_ALLOW_NETWORKS = []
    with pytest.raises(ValidationError, match="outbound address policy"):
        AlertWebhook(tenant=world_a.tenant, name="other", url=receiver, secret_encrypted="x").full_clean()
    delivery = settled(alert_test(webhook=hook).pk, timeout=20)
    assert delivery.status == "failed" and "OutboundRefused" in delivery.error
    assert Receiver.seen == []


def test_the_rules_fire_once_per_window(world_a: TenantWorld, world_b: TenantWorld, receiver: str) -> None:
    """An upstream's corruption rate over its threshold, too many exhausted requests and broken loops each fire
    one Slack-format alert; evaluating again within the window sends nothing more; B's traffic never counts."""
    make_hook(world_a, receiver, corruption_rate=0.25, min_requests=5, exhausted_over=1, loops_over=0)
    requests(world_a, *["clean"] * 6, "recovered-by-retry", "exhausted", "exhausted")
    requests(world_b, *["exhausted"] * 20)
    row = ProxyRequest.objects.filter(tenant=world_a.tenant).first()
    assert row is not None
    Finding.objects.create(request=row, tenant_id_copy=world_a.tenant.pk, kind="agent-loop", severity="warning",
                           action="error", detail="same call 4 times")
    created = alerts_evaluate()
    rules = sorted(settled(pk).rule for pk in created)
    assert rules == ["corruption-rate", "exhausted", "loops-broken"]
    assert all(d.status == "delivered" for d in AlertDelivery.objects.all())
    texts = sorted(json.loads(body)["text"] for _, body in Receiver.seen)
    assert any("33% of guarded requests to upstream tenant-a-upstream" in t for t in texts), texts
    assert any("2 requests ran out of retries" in t for t in texts), texts
    assert alerts_evaluate() == []
    assert tick() == 0


def test_rules_under_their_thresholds_or_outside_the_window_do_not_fire(world_a: TenantWorld, receiver: str) -> None:
    make_hook(world_a, receiver, corruption_rate=0.5, min_requests=5, exhausted_over=3)
    requests(world_a, "clean", "clean", "recovered-by-retry", "exhausted")  # under min_requests
    requests(world_a, *["exhausted"] * 10, minutes_ago=60)  # outside the 15-minute window
    assert alerts_evaluate() == []


def test_the_test_button_is_for_the_tenants_admins_only(world_a: TenantWorld, receiver: str, admin_a: Any,
                                                        viewer_a: Any, outsider_b: Any, client: Any) -> None:
    """POST to the test URL: A's admin queues a test alert and lands on the delivery log; A's viewer is
    refused; B's admin gets the page a missing webhook gets."""
    hook = make_hook(world_a, receiver)
    url = f"/admin/alerts/alertwebhook/{hook.pk}/test/"
    client.force_login(outsider_b)
    assert client.post(url).status_code == 404
    assert client.get(f"/admin/alerts/alertwebhook/{hook.pk}/change/").status_code in (302, 404)
    client.force_login(viewer_a)
    assert client.post(url).status_code == 403
    assert AlertDelivery.objects.count() == 0
    client.force_login(admin_a)
    page = client.get(f"/admin/alerts/alertwebhook/{hook.pk}/change/").content.decode()
    assert "Send a test alert" in page and SECRET not in page
    answer = client.post(url)
    assert answer.status_code == 302 and f"alertdelivery/?webhook={hook.pk}" in answer["Location"]
    delivery = settled(AlertDelivery.objects.get().pk)
    assert delivery.status == "delivered"
    log = client.get(answer["Location"]).content.decode()
    assert "delivered" in log and "test" in log


def test_the_delivery_log_is_scoped_to_the_users_tenants(world_a: TenantWorld, world_b: TenantWorld,
                                                        receiver: str, outsider_b: Any, client: Any) -> None:
    settled(alert_test(webhook=make_hook(world_a, receiver, name="a-hook")).pk)
    settled(alert_test(webhook=make_hook(world_b, receiver, name="b-hook")).pk)
    client.force_login(outsider_b)
    log = client.get("/admin/alerts/alertdelivery/").content.decode()
    assert "b-hook" in log and "a-hook" not in log
    hooks = client.get("/admin/alerts/alertwebhook/").content.decode()
    assert "b-hook" in hooks and "a-hook" not in hooks


def test_a_new_webhook_needs_a_secret_and_never_shows_it(world_a: TenantWorld, receiver: str, admin_a: Any,
                                                         client: Any) -> None:
    """Through the admin form: without a secret it is refused; with one it is stored encrypted."""
    client.force_login(admin_a)
    form = {"tenant": world_a.tenant.pk, "name": "chat", "url": receiver, "format": "slack", "enabled": "on",
            "window_minutes": 15, "min_requests": 20}
    refused = client.post("/admin/alerts/alertwebhook/add/", form)
    assert refused.status_code == 200 and "needs a signing secret" in refused.content.decode()
    saved = client.post("/admin/alerts/alertwebhook/add/", {**form, "new_secret": SECRET})
    assert saved.status_code == 302
    hook = AlertWebhook.objects.get(name="chat")
    assert hook.secret() == SECRET and SECRET not in hook.secret_encrypted


def test_setup_schedules_registers_the_evaluation(world_a: TenantWorld) -> None:
    """Beat evaluates the rules every minute (a PeriodicTask for a task Celery knows)."""
    from config.celery import app

    call_command("setup_schedules", stdout=io.StringIO())
    row = PeriodicTask.objects.get(task="alerts.tasks.alerts_evaluate_task")
    assert row.task in app.tasks and row.crontab.minute == "*"


def test_slack_bodies_are_a_text_message() -> None:
    alert = {"event": "alert", "rule": "exhausted", "tenant": "acme", "subject": "tenant", "summary": "3 requests"}
    assert json.loads(webhook.body(alert, "slack")) == {"text": "[toolrelay] acme / tenant: 3 requests"}


def test_a_money_budget_past_its_soft_threshold_fires_once(world_a: TenantWorld, world_b: TenantWorld,
                                                           receiver: str) -> None:
    """Issue 19 item 4: the ``money-budget-threshold`` finding of a request fires the tenant's webhook once,
    with no threshold to configure; another tenant's never counts."""
    make_hook(world_a, receiver)
    requests(world_a, "clean")
    requests(world_b, "clean")
    for world in (world_a, world_b):
        row = ProxyRequest.objects.filter(tenant=world.tenant).first()
        assert row is not None
        Finding.objects.create(request=row, tenant_id_copy=world.tenant.pk, kind="money-budget-threshold",
                               severity="warning", action="ignored",
                               detail="the tenant's daily budget passed 80%: $8.1 of $10 spent or reserved")
    created = alerts_evaluate()
    assert [settled(pk).rule for pk in created] == ["money-budget"]
    (text,) = [json.loads(body)["text"] for _, body in Receiver.seen]
    assert "daily budget passed 80%" in text
    assert alerts_evaluate() == []


def test_the_test_button_is_rate_limited_per_webhook_and_tenant(world_a: TenantWorld, receiver: str, admin_a: Any,
                                                                client: Any, settings: Any) -> None:
    """Issue 24 item 9: 120 presses in 10 s against a receiver that never answered exhausted Postgres
    connections. Now one test alert per webhook per ALERT_TEST_INTERVAL_SECONDS, a few per tenant per minute."""
    settings.ALERT_TEST_PER_TENANT_PER_MINUTE = 2
    hooks = [make_hook(world_a, receiver, name=f"hook-{n}") for n in range(3)]
    client.force_login(admin_a)
    for _ in range(5):
        client.post(f"/admin/alerts/alertwebhook/{hooks[0].pk}/test/")
    assert AlertDelivery.objects.filter(webhook=hooks[0]).count() == 1
    answer = client.post(f"/admin/alerts/alertwebhook/{hooks[0].pk}/test/", follow=True)
    assert "less than 10 s ago" in answer.content.decode()
    client.post(f"/admin/alerts/alertwebhook/{hooks[1].pk}/test/")
    client.post(f"/admin/alerts/alertwebhook/{hooks[2].pk}/test/")
    assert AlertDelivery.objects.count() == 2, "the tenant's per-minute bound"
    for delivery in AlertDelivery.objects.all():
        settled(delivery.pk)


def test_eager_tasks_run_on_a_bounded_number_of_threads(settings: Any) -> None:
    """Without a broker, at most EAGER_TASK_WORKERS eager tasks run at once (each may hold a database
    connection); past EAGER_TASK_QUEUE waiting, a task is not started."""
    from audit import tasks

    settings.EAGER_TASK_WORKERS, settings.EAGER_TASK_QUEUE = 2, 3
    slots = tasks._EagerSlots()
    release = threading.Event()
    running: list[int] = []
    peak = [0]
    lock = threading.Lock()

    def work() -> None:
        with lock:
            running.append(1)
            peak[0] = max(peak[0], len(running))
        release.wait(10)
        with lock:
            running.pop()

    admitted = [slots.admit() for _ in range(4)]
    assert admitted == [True, True, True, False]
    threads = [threading.Thread(target=slots.run, args=(work,)) for _ in range(3)]
    for thread in threads:
        thread.start()
    time.sleep(0.2)
    assert peak[0] == 2 and slots.running == 2 and slots.waiting == 1
    release.set()
    for thread in threads:
        thread.join(10)
    assert slots.running == 0 and slots.waiting == 0 and peak[0] == 2
