"""scripts/test_agents.py (`make test-agents`): the headless commands it builds and its verdicts.

The agents themselves are not run here (npm, minutes): `make test-agents` does that.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import tomllib
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "test_agents.py"


@pytest.fixture(scope="module")
def script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("test_agents_script_module", SCRIPT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_each_agent_is_pointed_at_the_base_url_with_the_key_and_model(script: ModuleType, tmp_path: Path) -> None:
    cache, base = tmp_path / "cache", "http://127.0.0.1:9"
    work = tmp_path / "work"
    work.mkdir()
    argv, env = script.command("claude", cache, work, base, "tr-k", "claude-x")
    assert (env["ANTHROPIC_BASE_URL"], env["ANTHROPIC_API_KEY"], argv[argv.index("--model") + 1]) == (
        base,
        "tr-k",
        "claude-x",
    )
    argv, env = script.command("codex", cache, work, base, "tr-k", "gpt-x")
    config = tomllib.loads((Path(env["CODEX_HOME"]) / "config.toml").read_text())
    assert config["model"] == "gpt-x"
    assert config["model_providers"]["tr"] == {"name": "toolrelay", "base_url": f"{base}/v1", "env_key": "TR_KEY",
                                                    "wire_api": "responses"}  # fmt: skip
    assert (env["TR_KEY"], argv[1]) == ("tr-k", "exec")
    argv, env = script.command("opencode", cache, work, base, "tr-k", "task:steps=2")
    opencode = json.loads((work / "opencode.json").read_text())
    assert opencode["provider"]["tr"]["options"] == {"baseURL": f"{base}/v1", "apiKey": "tr-k"}
    assert argv[argv.index("-m") + 1] == opencode["model"] == "tr/task:steps=2"
    argv, env = script.command("qwen", cache, work, base, "tr-k", "m")
    assert (env["OPENAI_BASE_URL"], env["OPENAI_API_KEY"], env["OPENAI_MODEL"]) == (f"{base}/v1", "tr-k", "m")


def test_the_verdict_wants_every_proxy_run_complete_or_with_failing_every_proxy_run_failed(script: ModuleType) -> None:
    def result(path: str, steps: int, status: int) -> object:
        return script.Result("qwen", path, steps, 10, status, 1.0, 11, 3)

    complete, short, failed = result("proxy", 10, 0), result("proxy", 9, 0), result("proxy", 0, 1)
    direct_short = result("direct", 2, 0)
    assert script.verdict([complete, direct_short], failing=False) == 0
    assert script.verdict([complete, short], failing=False) == 1
    assert script.verdict([failed, direct_short], failing=True) == 0
    assert script.verdict([failed, complete], failing=True) == 1
    assert script.verdict([], failing=False) == script.verdict([], failing=True) == 1
    # --budget-spent at 30%: a run that met no fault needs no retry, so it must complete, not fail
    untouched = script.Result("qwen", "proxy", 10, 10, 0, 1.0, 11, 0)
    assert script.verdict([failed, untouched], failing=True) == 0
    assert script.verdict([failed, script.Result("qwen", "proxy", 3, 10, 0, 1.0, 11, 0)], failing=True) == 1
