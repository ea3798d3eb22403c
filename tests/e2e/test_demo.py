"""``scripts/tool_call_demo.py`` against the simulator and a real Daphne: it survives every fault the
simulator produces, finds the ports `make run` saved, says when nothing listens, and each count it
prints matches the simulator's records and toolrelay's audit rows."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from proxy.simulator import FAULTS
from tests.e2e.conftest import ROOT, ProxyServer, TenantFixture, _free_port

SCRIPT = ROOT / "scripts" / "tool_call_demo.py"
#: Outcomes after which the client got a usable turn (every other one must be counted as broken).
USABLE = {"clean", "normalized", "repaired", "recovered-by-retry"}


def _load_demo() -> ModuleType:
    spec = importlib.util.spec_from_file_location("tool_call_demo", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


demo = _load_demo()


def _records_by_marker(simulator: Any) -> dict[str, list[dict[str, Any]]]:
    """Simulator records grouped by the demo marker in their user message."""
    out: dict[str, list[dict[str, Any]]] = {}
    for record in simulator.stats()["requests"]:
        content = str(((record.get("body") or {}).get("messages") or [{}])[0].get("content", ""))
        if content.endswith("]") and "[" in content:
            out.setdefault(content.rsplit("[", 1)[1][:-1], []).append(record)
    return out


def _demo_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PORT", "SIMULATOR_PORT", "SITE_URL", "TOOLRELAY_VAR_DIR")}
    return {**env, **extra}


def _run_demo(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env,  # noqa: S603
                          cwd=ROOT, timeout=120, check=False)


@pytest.mark.parametrize("kind", sorted(FAULTS))
def test_it_survives_and_judges_every_fault_kind(kind: str, make_tenant: Callable[..., TenantFixture],
                                                 simulator: Any, audit_rows: Callable[..., Any]) -> None:
    """Each kind corrupts the direct turn (the simulator says so) without crashing the demo; through
    toolrelay the demo's verdict agrees with the audit: broken exactly when no usable turn came back."""
    tenant = make_tenant()
    model = f"gen:corrupt=1:kinds={kind}"
    direct = demo.run("direct", simulator.url, "sk-direct", model, 1, proxy=False)
    relayed = demo.run("proxy", tenant.base_url, tenant.api_key, model, 1, proxy=True)
    [records] = [r for m, r in _records_by_marker(simulator).items() if m == direct.turns[0].marker]
    assert records[0]["fault"] == kind
    [turn] = relayed.turns
    row = audit_rows(turn.request_id)
    assert (turn.problem is not None) == (row.outcome not in USABLE), (turn.problem, row.outcome)
    if row.outcome == "exhausted":
        assert turn.problem == "toolrelay gave up (retries exhausted)"
    if kind == "arguments-as-json-object":  # the fault that used to crash the demo
        assert direct.turns[0].problem is not None


def test_its_counts_match_the_audit_on_the_ports_make_run_saved(make_tenant: Callable[..., TenantFixture],
                                                                proxy_server: ProxyServer, simulator: Any,
                                                                audit_rows: Callable[..., Any],
                                                                django_db_blocker: Any, tmp_path: Path) -> None:
    """Ports from ``var/run.env`` (non-default, nothing in the environment); every fault kind drawn
    at random: the broken counts are the sums of their reasons, a direct turn without a fault is
    never broken, and through toolrelay a turn is broken exactly when its audit row is not usable."""
    from audit.models import ProxyRequest

    tenant = make_tenant()
    proxy_port, sim_port = proxy_server.url.rsplit(":", 1)[1], str(simulator.port)
    (tmp_path / "run.env").write_text(f"SITE_URL=http://127.0.0.1:{proxy_port}\nPORT={proxy_port}\n"
                                      f"SIMULATOR_PORT={sim_port}\n")
    done = _run_demo("--key", tenant.api_key, "--requests", "24", "--model", "gen:corrupt=0.5", "--json",
                     env=_demo_env(TOOLRELAY_VAR_DIR=str(tmp_path)))
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    direct, relayed = report["direct"], report["proxy"]
    assert direct["url"] == f"http://127.0.0.1:{sim_port}/v1" and relayed["url"] == f"{proxy_server.url}/v1"
    for side in (direct, relayed):
        assert side["requests"] == len(side["turns"]) == 24
        assert side["broken"] == sum(side["reasons"].values()) == sum(t["problem"] is not None for t in side["turns"])
    records = _records_by_marker(simulator)
    assert all(records[t["marker"]][0]["fault"] is not None for t in direct["turns"] if t["problem"] is not None)
    outcomes = {t["request_id"]: audit_rows(t["request_id"]).outcome for t in relayed["turns"]}
    assert len(outcomes) == 24
    assert {rid: o not in USABLE for rid, o in outcomes.items()} == {
        t["request_id"]: t["problem"] is not None for t in relayed["turns"]}
    with django_db_blocker.unblock():
        assert ProxyRequest.objects.filter(tenant=tenant.tenant).count() == 24
    assert sum(len(records[t["marker"]]) for t in relayed["turns"]) >= 24  # retries show as extra attempts


def test_it_says_nothing_is_listening_instead_of_counting_broken_turns(tmp_path: Path) -> None:
    """``PORT`` / ``SIMULATOR_PORT`` are honoured; a port nobody listens on is exit status 2 and a
    sentence naming the URL, not "N / N broken turns"."""
    port, sim_port = _free_port(), _free_port()
    done = _run_demo("--key", "tr-x", "--requests", "3", env=_demo_env(PORT=str(port), SIMULATOR_PORT=str(sim_port)))
    assert done.returncode == 2
    assert f"nothing is listening at http://127.0.0.1:{sim_port}/v1" in done.stderr
    assert "broken turns" not in done.stdout


def test_it_reports_a_refused_key_before_sending_turns(proxy_server: ProxyServer, simulator: Any) -> None:
    """A key toolrelay does not know is one clear line, exit status 2."""
    done = _run_demo("--key", "tr-aaaaaaaaaaaa-not-a-key", "--requests", "2", "--proxy", proxy_server.v1,
                     "--upstream", simulator.url, env=_demo_env())
    assert done.returncode == 2 and "refused the key" in done.stderr


def test_it_judges_odd_tool_call_shapes_without_raising() -> None:
    """Whatever the SDK hands over (an object as arguments, no function, JSON that is not an object)."""
    class Function:
        def __init__(self, name: Any, arguments: Any) -> None:
            self.name, self.arguments = name, arguments

    class Call:
        def __init__(self, function: Any) -> None:
            self.function = function

    as_object = Call(Function("get_weather", {"city": "Paris"}))
    assert demo.call_problem(as_object) == "invalid arguments (not a JSON string)"
    assert demo.call_problem(Call(None)) == "undeclared tool name"
    assert demo.call_problem(Call(Function("get_weather", "[1]"))) == "invalid arguments (not an object)"
    assert demo.call_problem(Call(Function("get_weather", '{"city": 3}'))) == "invalid arguments (schema)"
    assert demo.call_problem(Call(Function("get_time", ""))) == "invalid arguments (not JSON)"
    assert demo.call_problem(Call(Function("get_weather", '{"city": "Paris"}'))) is None
