"""`make audit-deps`: pip-audit over the lock files, with a clear verdict.

Exit 0 with "skipped" when the advisory data cannot be reached (no network, or an index that
serves packages but not PyPI's JSON API, where pip-audit's default service reads advisories);
exit 1 when a locked package has a known vulnerability; exit 0 when none has.
Run with the supply-chain tools' interpreter (the Makefile makes it).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

LOCKS = ("requirements/runtime.txt", "requirements/dev.txt")


def audit(lock: str) -> tuple[int, dict[str, object] | None, str]:
    """Run pip-audit on one hashed lock file (no resolution, no install); (exit code, report, stderr)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "report.json"
        done = subprocess.run(  # noqa: S603 - fixed argv
            [sys.executable, "-m", "pip_audit", "-r", lock, "--disable-pip", "--no-deps", "--progress-spinner",
             "off", "-f", "json", "-o", str(out)], capture_output=True, text=True, timeout=600, check=False)
        report = json.loads(out.read_text()) if out.is_file() and out.stat().st_size else None
    return done.returncode, report, done.stderr


def verdict(lock: str) -> int:
    code, report, stderr = audit(lock)
    deps = report.get("dependencies", []) if isinstance(report, dict) else []
    assert isinstance(deps, list)
    audited = [d for d in deps if "skip_reason" not in d]
    if report is None or not audited:
        reason = stderr.strip().splitlines()[-1] if stderr.strip() and report is None else \
            f"none of {len(deps)} packages could be looked up"
        print(f"audit-deps: {lock}: skipped: the advisory database cannot be reached from here ({reason})")
        return 0
    vulnerable = [d for d in audited if d.get("vulns")]
    for dep in vulnerable:
        ids = ", ".join(v["id"] for v in dep["vulns"])
        print(f"audit-deps: {lock}: {dep['name']} {dep['version']}: {ids}")
    skipped = len(deps) - len(audited)
    note = f" ({skipped} not looked up)" if skipped else ""
    print(f"audit-deps: {lock}: {len(vulnerable)} vulnerable of {len(audited)} audited packages{note}")
    return 1 if vulnerable or code not in (0, 1) else 0


if __name__ == "__main__":
    sys.exit(max(verdict(lock) for lock in LOCKS))
