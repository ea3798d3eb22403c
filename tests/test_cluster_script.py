"""scripts/cluster.py (`make cluster`): its nginx configuration and its process plan, without starting anything.

`make test-cluster` runs the cluster itself (minutes, a private Postgres and Redis).
"""

from __future__ import annotations

import importlib.util
import re
import signal
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "cluster.py"


@pytest.fixture(scope="module")
def script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("cluster_script_module", SCRIPT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_nginx_balances_by_least_connections_over_every_serve_port_and_never_buffers(script: ModuleType) -> None:
    layout = script.Layout(root=Path("/srv/tr"), port=9000, serves=3)
    conf = script.nginx_conf(layout)
    upstream = re.search(r"upstream toolrelay \{(.*?)\}", conf, re.S)
    assert upstream is not None
    assert "least_conn;" in upstream.group(1)
    assert re.findall(r"server 127\.0\.0\.1:(\d+)", upstream.group(1)) == ["9001", "9002", "9003"]
    assert "keepalive" not in upstream.group(1)  # a cached connection to a draining process would fail a POST
    for line in ("listen 127.0.0.1:9000", "proxy_buffering off;", "proxy_request_buffering on;",
                 "proxy_http_version 1.1;", "proxy_set_header X-Forwarded-For $remote_addr;", "daemon off;",
                 "proxy_next_upstream error non_idempotent;", "proxy_next_upstream_tries 2;"):
        assert line in conf
    assert conf.count("{") == conf.count("}")
    assert "/srv/tr/var/cluster/run/nginx.pid" in conf and "user " not in conf
    assert "user root;" in script.nginx_conf(layout, user="root")


def test_the_plan_runs_one_writer_and_serve_processes_that_leave_the_journal_to_it(script: ModuleType) -> None:
    layout = script.Layout(root=Path("/srv/tr"), port=9000, serves=3, python="/venv/bin/python")
    procs = script.plan(layout)
    names = [p.name for p in procs]
    assert names == ["simulator", "journal-writer", "serve-1", "serve-2", "serve-3", "celery-worker",
                     "celery-beat", "nginx"]
    serves = [p for p in procs if p.name.startswith("serve-")]
    assert [p.argv[p.argv.index("--port") + 1] for p in serves] == ["9001", "9002", "9003"]
    assert all(p.env == {"JOURNAL_WRITER": "external"} and "--proxy-headers" in p.argv for p in serves)
    assert all(p.ready == f"http://127.0.0.1:{9000 + i}/readyz" for i, p in enumerate(serves, 1))
    assert procs[1].argv == ["/venv/bin/python", "manage.py", "journal_writer"] and not procs[1].env
    beat = procs[names.index("celery-beat")]
    assert beat.argv[:4] == ["/venv/bin/celery", "-A", "config", "beat"] and "DatabaseScheduler" in beat.argv[-1]
    assert procs[-1].stop_signal == signal.SIGQUIT and procs[-1].marker == "/srv/tr/var/cluster/nginx.conf"
    assert len({p.marker for p in procs}) == len(procs)  # every process told apart from a reused pid


def test_the_environment_keeps_the_cluster_to_its_own_servers_and_folders(script: ModuleType) -> None:
    layout = script.Layout(root=Path("/srv/tr"), port=9000, serves=2)
    env = script.cluster_env(layout, {"SECRET_KEY": "s", "CREDENTIAL_KEYS": "k"})
    assert env["DATABASE_URL"] == "postgres://postgres@127.0.0.1:9013/toolrelay"
    assert env["REDIS_URL"] == "redis://127.0.0.1:9012/0" and env["REDIS_PREFIX"] == "trcluster9000:"
    assert env["JOURNAL_DIR"] == "/srv/tr/var/cluster/journal" and env["SITE_URL"] == "http://127.0.0.1:9000"
    assert env["UPSTREAM_ALLOW_NETWORKS"] == "127.0.0.1/32" and env["SECRET_KEY"] == "s"
    assert [p.name for p in script.plan(layout)].count("journal-writer") == 1


def test_the_port_and_the_number_of_processes_come_from_the_environment_bounded(script: ModuleType) -> None:
    assert script.layout_from_env({}).port == 8080 and script.layout_from_env({}).serves == 3
    assert script.layout_from_env({"CLUSTER_PORT": "9100", "CLUSTER_SERVES": "1"}).serve_ports == [9101]
    for bad in ({"CLUSTER_PORT": "80"}, {"CLUSTER_SERVES": "0"}, {"CLUSTER_SERVES": "99"}, {"CLUSTER_PORT": "x"}):
        with pytest.raises(ValueError):
            script.layout_from_env(bad)
