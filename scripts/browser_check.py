"""`make test-browser`: the admin in a real, headless Chromium at 1400 px wide.

Builds a throwaway SQLite database in ``var/browser/`` with a superuser and a few hours of audit rows
(every outcome, attempts, findings), serves it with Daphne on a free port, logs in with Selenium
(Debian's ``chromium`` and ``chromedriver``), and saves screenshots of the proxy requests list, a
request's page, the dashboard, the findings and reports lists and the live incidents page into
``var/browser/``; the live page's WebSocket must open (its script runs under the CSP, and connect-src
lets it connect). It fails (exit 1) when a list does not fit (requests: the outcome column must be
visible; requests, findings, reports: the last column must end inside the window) or when the live
feed does not connect.

    .venv/bin/python scripts/browser_check.py [--keep]     # --keep: leave the server running
"""

from __future__ import annotations

import argparse
import os
import random
import secrets
import shutil
import socket
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "var" / "browser"
WIDTH, HEIGHT = 1400, 1000
CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
OUTCOMES = ("clean", "clean", "clean", "normalized", "normalized", "repaired", "recovered-by-retry",
            "recovered-by-retry", "exhausted", "upstream-error", "client-cancelled")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def environment() -> dict[str, str]:
    """A throwaway setup: SQLite and media under var/browser, development secrets, no broker."""
    drop = {"DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL", "PROMETHEUS_MULTIPROC_DIR"}
    env = {k: v for k, v in os.environ.items() if k not in drop}
    return {**env, "TOOLRELAY_VAR_DIR": str(OUT), "DEBUG": "1", "LOG_LEVEL": "WARNING",
            "SECRET_KEY": "browser-check-" + secrets.token_urlsafe(16), "DJANGO_SETTINGS_MODULE": "config.settings"}


def seed(password: str) -> None:
    """Migrate, then a superuser and ~60 requests of the last 6 hours over two tenants."""
    import django

    django.setup()
    from django.contrib.auth.models import User
    from django.core.management import call_command
    from django.utils import timezone

    from audit.models import Attempt, Finding, ProxyRequest
    from tenants.services import provision, upstream_upsert

    call_command("migrate", verbosity=0, interactive=False)
    User.objects.create_superuser("browser", "", password)
    rng, now = random.Random(16), timezone.now()  # noqa: S311 - made-up rows
    for slug in ("acme-research", "globex"):
        done = provision(tenant_name=slug, upstream_url="https://api.deepseek.com/v1",
                         routes={"claude-*": "deepseek-chat"})
        upstreams = [done.upstream, upstream_upsert(tenant=done.tenant, name="qwen-fallback",
                                                    base_url="https://dashscope.example/v1")]
        for n in range(30):
            outcome = rng.choice(OUTCOMES)
            attempts = 3 if outcome == "exhausted" else 2 if outcome == "recovered-by-retry" else 1
            at = now - timedelta(minutes=rng.randint(1, 360))
            row = ProxyRequest.objects.create(
                tenant=done.tenant, upstream=upstreams[n % 2], model=rng.choice(["claude-sonnet-4-5", "deepseek-chat"]),
                upstream_model="deepseek-chat", path="guarded", outcome=outcome, attempts=attempts, status=200,
                ttft_ms=rng.uniform(80, 2500), total_ms=rng.uniform(900, 9000), prompt_tokens=1200,
                completion_tokens=300, wasted_completion_tokens=120 * (attempts - 1), created=at,
                client_user_agent="claude-cli/2.0.1", finished=at + timedelta(seconds=4))
            for number in range(attempts):
                last = number == attempts - 1 and outcome != "exhausted"
                attempt = Attempt.objects.create(
                    request=row, number=number, upstream=upstreams[n % 2], upstream_model="deepseek-chat",
                    upstream_status=200, outcome="clean" if last else "retry", ttfb_ms=rng.uniform(60, 900),
                    duration_ms=rng.uniform(400, 3000), prompt_tokens=1200, completion_tokens=150,
                    bytes_received=rng.randint(2000, 9000), frames=rng.randint(20, 90),
                    abort_reason="" if last else "the arguments of read_file cannot become valid JSON")
                if not last:
                    Finding.objects.create(request=row, attempt=attempt, tenant_id_copy=done.tenant.pk,
                                           kind="arguments-not-json", severity="error", action="retry",
                                           tool_name="read_file", frame=12, byte_offset=1830,
                                           detail="tool call 0 (read_file): arguments stop being JSON at character 41")
            if outcome == "exhausted":  # the longest kind and a long MCP tool name: they must wrap, not widen the list
                Finding.objects.create(request=row, attempt=attempt, tenant_id_copy=done.tenant.pk,
                                       kind="empty-string-finish-reason-and-legacy-stub", severity="warning",
                                       action="repaired", tool_name="mcp__filesystem__read_multiple_files", frame=3,
                                       detail="finish_reason \"\" and a legacy function_call stub on the final chunk")
            if outcome == "normalized":
                Finding.objects.create(request=row, tenant_id_copy=done.tenant.pk, kind="sse-comment-keepalives",
                                       severity="info", action="ignored", detail="2 comment lines skipped")
    # A finished CSV report (two downloads: the list showed only the first at 1400 px).
    from audit.models import Report
    from tenants.models import Tenant

    Report.objects.create(since=now - timedelta(days=1), until=now, format="csv", status="done", progress=100,
                          file="reports/2026/01/report-1-requests.csv",
                          findings_file="reports/2026/01/report-1-findings.csv")
    # One over both tenants, with the file names a long-running install has.
    Report.objects.create(since=now - timedelta(days=30), until=now, format="csv", status="done", progress=100,
                          file="reports/2026/01/report-10482-requests.csv",
                          findings_file="reports/2026/01/report-10482-findings.csv").tenants.set(Tenant.objects.all())


def serve(env: dict[str, str], port: int) -> subprocess.Popen[bytes]:
    """Daphne on ``port``; returns once /healthz answers."""
    log = (OUT / "daphne.log").open("wb")
    process = subprocess.Popen([sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port),  # noqa: S603
                                "config.asgi:application"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    import httpx

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"daphne exited; see {OUT / 'daphne.log'}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return process
        except httpx.TransportError:
            time.sleep(0.2)
    process.terminate()
    raise SystemExit("daphne did not start within 30 s")


def browser() -> Any:
    """Headless Chromium through chromedriver, 1400 px wide."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                 f"--window-size={WIDTH},{HEIGHT}", "--hide-scrollbars"):
        options.add_argument(flag)
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)


def shoot(driver: Any, url: str, name: str, *, full: bool = False) -> Path:
    """Load ``url``, screenshot it (the whole page height when ``full``) into var/browser/``name``."""
    driver.set_window_size(WIDTH, HEIGHT)
    driver.get(url)
    if full:
        height = int(driver.execute_script("return document.documentElement.scrollHeight"))
        driver.set_window_size(WIDTH, min(max(height, HEIGHT), 8000))
    path = OUT / name
    driver.save_screenshot(str(path))
    return path


_VISIBLE_RIGHT = """
const box = document.querySelector('#changelist .results') || document.documentElement;
return Math.min(box.getBoundingClientRect().right, document.documentElement.clientWidth);
"""


def check_list(driver: Any) -> list[str]:
    """Problems with the requests list at 1400 px: the outcome column hidden or scrolled out of the
    list's box (which scrolls sideways instead of widening the page), a column past its right edge."""
    from selenium.webdriver.common.by import By

    problems = []
    right = float(driver.execute_script(_VISIBLE_RIGHT))
    headers = driver.find_elements(By.CSS_SELECTOR, "#result_list thead th")
    outcome = [h for h in headers if "column-outcome_pill" in (h.get_attribute("class") or "")]
    if not outcome or not outcome[0].is_displayed():
        problems.append("the outcome column is not shown")
    elif outcome[0].rect["x"] + outcome[0].rect["width"] > right + 1:
        problems.append(f"the outcome column ends at {outcome[0].rect['x'] + outcome[0].rect['width']:.0f} px, "
                        f"the list's visible box at {right:.0f} px")
    if headers and headers[-1].rect["x"] + headers[-1].rect["width"] > right + 1:
        problems.append(f"the last column ends at {headers[-1].rect['x'] + headers[-1].rect['width']:.0f} px, "
                        f"the list's visible box at {right:.0f} px (it scrolls sideways)")
    pills = driver.find_elements(By.CSS_SELECTOR, "#result_list td.field-outcome_pill .tr-pill")
    if not pills or not pills[0].is_displayed():
        problems.append("no coloured outcome is visible")
    return problems


def check_fits(driver: Any, name: str, *, whole: str = "") -> list[str]:
    """Problems with another list at 1400 px (the findings, the reports): its last column past the edge
    of the list's visible box, its page without rows (nothing was checked), or one of the ``whole``
    elements (a CSS selector: the findings' detail texts, the reports' download links) not shown or
    ending past that edge."""
    from selenium.webdriver.common.by import By

    right = float(driver.execute_script(_VISIBLE_RIGHT))
    headers = driver.find_elements(By.CSS_SELECTOR, "#result_list thead th")
    if not driver.find_elements(By.CSS_SELECTOR, "#result_list tbody tr"):
        return [f"the {name} list has no rows"]
    problems = []
    end = headers[-1].rect["x"] + headers[-1].rect["width"]
    if end > right + 1:
        problems.append(f"the {name} list's last column ends at {end:.0f} px, its visible box at {right:.0f} px")
    if whole:
        shown = driver.find_elements(By.CSS_SELECTOR, whole)
        cut = [e for e in shown if not e.is_displayed() or e.rect["x"] + e.rect["width"] > right + 1]
        if not shown:
            problems.append(f"the {name} list shows no {whole}")
        elif cut:
            problems.append(f"{len(cut)} of {len(shown)} {whole} in the {name} list are cut off (one ends at "
                            f"{cut[0].rect['x'] + cut[0].rect['width']:.0f} px, the visible box at {right:.0f} px)")
    return problems


def check_live_feed(driver: Any, base: str) -> list[str]:
    """The live incidents page: its script runs under the CSP and its WebSocket opens (within 10 s)."""
    driver.get(f"{base}/admin/audit/proxyrequest/incidents/")
    deadline = time.monotonic() + 10
    state = ""
    while time.monotonic() < deadline:
        state = driver.find_element("id", "tr-feed-state").get_attribute("data-state") or ""
        if state == "open":
            return []
        time.sleep(0.2)
    return [f"the live incident feed did not connect (state {state!r})"]


def log_in(driver: Any, base: str, password: str) -> None:
    from selenium.webdriver.common.by import By

    driver.get(f"{base}/admin/login/")
    driver.find_element(By.NAME, "username").send_keys("browser")
    driver.find_element(By.NAME, "password").send_keys(password)
    driver.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
    if "/admin/login/" in driver.current_url:
        raise SystemExit("could not log in to the admin")


def run(keep: bool) -> int:
    """Seed, serve, screenshot, check; 0 when the list fits at 1400 px."""
    for tool in (CHROMIUM, CHROMEDRIVER):
        if not Path(tool).exists():
            raise SystemExit(f"{tool} is missing: `make test-browser` installs Debian's chromium and chromium-driver")
    shutil.rmtree(OUT, ignore_errors=True)
    OUT.mkdir(parents=True)
    env, password, port = environment(), secrets.token_urlsafe(12), _free_port()
    os.environ.update(env)
    seed(password)
    server = serve(env, port)
    base = f"http://127.0.0.1:{port}"
    driver = browser()
    try:
        log_in(driver, base, password)
        shots = [shoot(driver, f"{base}/admin/audit/proxyrequest/", "requests-list.png")]
        problems = check_list(driver)
        link = driver.find_element("css selector", "#result_list tbody tr:first-child th a").get_attribute("href")
        shots.append(shoot(driver, link, "request-page.png", full=True))
        shots.append(shoot(driver, f"{base}/admin/audit/proxyrequest/dashboard/", "dashboard.png", full=True))
        shots.append(shoot(driver, f"{base}/admin/", "index.png"))
        shots.append(shoot(driver, f"{base}/admin/audit/finding/?severity=all", "findings-list.png"))
        problems += check_fits(driver, "findings", whole="#result_list td.field-detail_short > span")
        shots.append(shoot(driver, f"{base}/admin/audit/report/", "reports-list.png"))
        problems += check_fits(driver, "reports", whole="#result_list td.field-downloads a")
        problems += check_live_feed(driver, base)
        shots.append(shoot(driver, f"{base}/admin/audit/proxyrequest/incidents/", "live-incidents.png"))
    finally:
        driver.quit()
        if keep:
            print(f"Still serving on {base}/admin/ (user browser, password {password}); pid {server.pid}.")
        else:
            server.terminate()
            server.wait(timeout=10)
    for shot in shots:
        print(f"screenshot: {shot.relative_to(ROOT)}")
    for problem in problems:
        print(f"FAIL: {problem}")
    print("lists at 1400 px: " + ("the outcome column is visible and every column fits" if not problems
                                          else f"{len(problems)} problem(s)"))
    return 1 if problems else 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--keep", action="store_true", help="leave the server running afterwards")
    sys.exit(run(parser.parse_args().keep))
