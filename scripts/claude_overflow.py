"""Real Claude Code (``claude -p``) against a simulator that refuses for context length, through toolrelay.

Does Claude Code retry with a smaller output budget, or compact, instead of failing three times
(issue 23, Acceptance)? Starts the simulator and toolrelay as ``make test-agents`` does
(``scripts/test_agents.py``'s ``Stack``; Claude Code from ``AGENT_CACHE``), routes every model to
``text:8:refuse=vllm-context/L`` (vLLM's 400 "maximum context length is L tokens. However, you requested
P + B tokens ..." whenever the prompt, at about 4 characters a token, plus ``max_tokens`` exceeds L),
runs one ``claude -p`` and prints each upstream request: ``max_tokens``, the simulator's prompt count,
the message count, the first characters of the last user message, the status. Then Claude Code's exit
status and its JSON result.

    .venv/bin/python scripts/claude_overflow.py --limit-over-prompt 12000   # fits once max_tokens is lowered
    .venv/bin/python scripts/claude_overflow.py --limit 2000                 # the prompt alone is too long
    .venv/bin/python scripts/claude_overflow.py --compact 2000               # a grown conversation: compaction?

``--limit-over-prompt D`` first asks the simulator the prompt's size (one run with a window of 1), then
sets the window to that prompt plus D tokens.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_agents import Stack, command, install  # noqa: E402

PROMPT = "Reply with the single word: ready."


def _rows(stack: Stack) -> list[dict[str, object]]:
    """The simulator's completion requests since its last reset, summarised."""
    rows = []
    for r in httpx.get(f"{stack.sim}/_sim/stats", timeout=5).json().get("requests", []):
        body = r.get("body") or {}
        messages = body.get("messages") or []
        last: dict[str, Any] = next((m for m in reversed(messages) if m.get("role") == "user"), {})
        text = last.get("content") if isinstance(last.get("content"), str) else json.dumps(last.get("content"))
        rows.append(
            {
                "max_tokens": body.get("max_tokens") or body.get("max_completion_tokens"),
                "prompt": max(1, len(json.dumps([messages, body.get("tools") or []], ensure_ascii=False)) // 4),
                "tools": len(body.get("tools") or []),
                "messages": len(messages),
                "last_user": (text or "")[-160:],
                "status": r.get("status"),
                "fault": r.get("fault"),
            }
        )
    return rows


Turn = tuple[int, str, list[dict[str, object]]]


def run(stack: Stack, cache: Path, timeout: float, work: Path, prompt: str, *, resume: bool = False) -> Turn:
    """One ``claude -p`` through toolrelay in ``work`` (``resume``: ``--continue`` its last session):
    exit status, its output, the upstream requests."""
    argv, extra = command("claude", cache, work, stack.proxy, stack.key, "claude-sonnet-4-5")
    argv[2] = prompt
    if resume:
        argv.insert(1, "--continue")
    stack.reset()
    try:
        done = subprocess.run(  # noqa: S603
            argv,
            cwd=work,
            env={**os.environ, **extra},
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
        status, out = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as exc:
        status, out = 124, str(exc.stdout or "")
    return status, out, _rows(stack)


def once(limit: int, cache: Path, timeout: float, work: Path, turns: list[tuple[str, bool]]) -> list[Turn]:
    """A fresh simulator and toolrelay whose routes refuse past a window of ``limit`` tokens; ``turns``
    (prompt, resume) run one after another in ``work``."""
    tmp = Path(tempfile.mkdtemp(prefix="toolrelay-overflow-"))
    stack = Stack(tmp, f"text:8:refuse=vllm-context/{limit}", budget_spent=False)
    try:
        stack.start()
        return [run(stack, cache, timeout, work, prompt, resume=resume) for prompt, resume in turns]
    finally:
        stack.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def _pasted(rel: str) -> str:
    """A prompt that pastes a project file (about 3,000 tokens) into the conversation."""
    text = (Path(__file__).resolve().parents[1] / rel).read_text(encoding="utf-8")[:12000]
    return f"Here is {rel}; keep it in mind and reply with the single word: noted.\n\n{text}"


def scenario(args: argparse.Namespace, cache: Path, work: Path) -> tuple[int, Turn]:
    """The window and the measured turn that ``args`` ask for."""
    if args.compact:  # a conversation that grew past the window: the next request is too long on input alone
        grown = once(
            10**7,
            cache,
            args.timeout,
            work,
            [(_pasted("docs/clients.md"), False), (_pasted("docs/architecture.md"), True)],
        )
        limit = int(str(grown[-1][2][-1]["prompt"])) - args.compact
        return limit, once(limit, cache, args.timeout, work, [("Reply with the single word: again.", True)])[0]
    limit = args.limit or 1
    if args.limit_over_prompt is not None:  # the prompt's size, from a run that every request fails
        first = once(1, cache, args.timeout, work, [(PROMPT, False)])[0]
        limit = int(str(first[2][0]["prompt"])) + args.limit_over_prompt
        shutil.rmtree(work / ".claude", ignore_errors=True)
    return limit, once(limit, cache, args.timeout, work, [(PROMPT, False)])[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--limit", type=int, help="the context window L, tokens")
    parser.add_argument("--limit-over-prompt", type=int, help="L = the first request's prompt + this many tokens")
    parser.add_argument(
        "--compact",
        type=int,
        metavar="D",
        help="grow a conversation by two pasted files, then a window D tokens under its prompt",
    )
    parser.add_argument("--timeout", type=float, default=180)
    args = parser.parse_args(argv)
    cache = Path(os.environ.get("AGENT_CACHE") or Path(__file__).resolve().parents[1] / "var" / "agent-cache")
    install(cache)
    work = Path(tempfile.mkdtemp(prefix="toolrelay-overflow-work-"))
    try:
        limit, (status, out, rows) = scenario(args, cache, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"window L = {limit} tokens; {len(rows)} upstream requests")
    for i, row in enumerate(rows, 1):
        print(
            f"{i:>3} max_tokens={row['max_tokens']} prompt~{row['prompt']} messages={row['messages']} "
            f"tools={row['tools']} "
            f"status={row['status']} fault={row['fault']} last_user={row['last_user']!r}"
        )
    print(f"claude exit {status}\n{out[-3000:]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
