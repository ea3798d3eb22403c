"""The four agents *interactive* (in a tmux pane) when toolrelay gives up on a turn: is its message
shown once, and does the agent stop instead of looping? (issue 23, Acceptance.)

Starts the simulator and toolrelay as ``make test-agents`` does (``scripts/test_agents.py``'s
``Stack``) with every tool-turn attempt broken beyond repair (``--broken``'s shapes at rate 1), then
each agent's interactive UI in a detached tmux session of 200x50 with the task's prompt given on its
command line, ``HOME`` a temp dir (onboarding settings written there), for ``--seconds``. Prints per
agent: the upstream requests, how often ``[toolrelay]`` appears in the pane, and the pane's last lines.

    AGENT_CACHE=/work/agent-cache .venv/bin/python scripts/agents_interactive.py --agents claude,codex
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_agents import BROKEN_KINDS, PROMPT, Stack, command, install  # noqa: E402


def _home(agent: str, home: Path, work: Path, key: str) -> None:
    """First-run settings so the UI goes straight to the prompt (trust, onboarding, the API key), and no
    self-update (Qwen Code's UI otherwise runs ``npm install -g`` of itself at start)."""
    if agent == "qwen":
        (home / ".qwen").mkdir()
        (home / ".qwen" / "settings.json").write_text(json.dumps({"general": {"enableAutoUpdate": False}}))
    if agent == "claude":
        (home / ".claude.json").write_text(
            json.dumps(
                {
                    "hasCompletedOnboarding": True,
                    "theme": "dark",
                    "bypassPermissionsModeAccepted": True,
                    "customApiKeyResponses": {"approved": [key[-20:]], "rejected": []},
                    "projects": {str(work): {"hasTrustDialogAccepted": True, "allowedTools": ["Bash"]}},
                }
            )
        )


def _argv(agent: str, cache: Path, work: Path, stack: Stack) -> tuple[list[str], dict[str, str]]:
    """The interactive invocation: the headless one with its headless flags swapped for the UI's."""
    model = {"claude": "claude-sonnet-4-5", "codex": "gpt-5"}.get(agent, "m")
    argv, extra = command(agent, cache, work, stack.proxy, stack.key, model)
    binary = argv[0]
    if agent == "claude":
        return [binary, "--allowedTools", "Bash", "--model", model, PROMPT], extra
    if agent == "codex":
        config = Path(extra["CODEX_HOME"]) / "config.toml"
        config.write_text(config.read_text() + f'\n[projects."{work}"]\ntrust_level = "trusted"\n')
        return [binary, "--dangerously-bypass-approvals-and-sandbox", PROMPT], extra
    if agent == "opencode":
        return [binary, "-m", f"tr/{model}", "--prompt", PROMPT], extra
    return [binary, "--auth-type", "openai", "--yolo", "-i", PROMPT], extra


TMUX = shutil.which("tmux") or "/usr/bin/tmux"


def _tmux(*args: str, check: bool = False) -> str:
    """``tmux args``; its stdout."""
    return subprocess.run([TMUX, *args], capture_output=True, text=True, check=check).stdout  # noqa: S603


def _pane(name: str) -> str:
    return _tmux("capture-pane", "-p", "-J", "-S", "-3000", "-t", name)


def run(agent: str, stack: Stack, cache: Path, seconds: float) -> dict[str, object]:
    """One interactive session for ``seconds``; what it showed and how many requests it sent."""
    work, home = stack.tmp / f"{agent}-ui", stack.tmp / f"{agent}-home"
    work.mkdir()
    home.mkdir()
    argv, extra = _argv(agent, cache, work, stack)
    _home(agent, home, work, stack.key)
    env = {**extra, "HOME": str(home), "TERM": "xterm-256color"}
    name = f"tr-ui-{agent}-{os.getpid()}"
    stack.reset()
    env_args = [f"-e{k}={v}" for k, v in env.items()]
    _tmux("new-session", "-d", "-s", name, "-x", "200", "-y", "50", "-c", str(work), *env_args, *argv, check=True)
    try:
        time.sleep(seconds)
        pane = _pane(name)
    finally:
        _tmux("kill-session", "-t", name)
    requests, corrupted = stack.requests()
    lines = pane.rstrip().splitlines()
    shown = [n for n, line in enumerate(lines) if "[toolrelay]" in line]
    around = [line for n, line in enumerate(lines) if any(abs(n - s) <= 2 for s in shown)]
    return {
        "agent": agent,
        "requests": requests,
        "corrupted": corrupted,
        "toolrelay_shown": pane.count("[toolrelay]"),
        "tail": "\n".join([*around, "--- last lines:", *lines[-25:]]),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--agents", default="claude,codex,opencode,qwen")
    parser.add_argument("--seconds", type=float, default=60)
    args = parser.parse_args(argv)
    cache = Path(os.environ.get("AGENT_CACHE") or Path(__file__).resolve().parents[1] / "var" / "agent-cache")
    install(cache)
    tmp = Path(tempfile.mkdtemp(prefix="toolrelay-ui-"))
    stack = Stack(tmp, f"task:steps=3:rate=1:seed=1:kinds={BROKEN_KINDS}", budget_spent=False)
    try:
        stack.start()
        for agent in args.agents.split(","):
            result = run(agent, stack, cache, args.seconds)
            print(
                f"== {agent}: {result['requests']} requests ({result['corrupted']} corrupted), "
                f"[toolrelay] shown {result['toolrelay_shown']} times\n{result['tail']}\n",
                flush=True,
            )
    finally:
        stack.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
