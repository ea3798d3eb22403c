"""`make audit-deps`: pip-audit over the lock files, with a clear verdict.

Exit 1 when a locked package has a known vulnerability; exit 0 when every package was looked up and
none has. When the advisory data cannot be reached (no network, or an index that serves packages but
not PyPI's JSON API, where pip-audit's default service reads advisories), or some packages could not
be looked up, it says "not checked" and exits 2 (issue 24 item 13: a check that cannot fail is none),
unless ``AUDIT_DEPS_ALLOW_UNCHECKED=1`` says an unchecked run is acceptable here (then 0).
Run with the supply-chain tools' interpreter (the Makefile makes it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

LOCKS = ("requirements/runtime.txt", "requirements/dev.txt")
#: The exit code of a run that could not check (some or all packages not looked up).
NOT_CHECKED = 2


def unchecked() -> int:
    """The exit code for a lock that could not be checked: 0 when ``AUDIT_DEPS_ALLOW_UNCHECKED=1``."""
    return 0 if os.environ.get("AUDIT_DEPS_ALLOW_UNCHECKED") == "1" else NOT_CHECKED


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
        print(f"audit-deps: {lock}: NOT CHECKED: the advisory database cannot be reached from here ({reason}); "
              "AUDIT_DEPS_ALLOW_UNCHECKED=1 accepts that")
        return unchecked()
    vulnerable = [d for d in audited if d.get("vulns")]
    for dep in vulnerable:
        ids = ", ".join(v["id"] for v in dep["vulns"])
        print(f"audit-deps: {lock}: {dep['name']} {dep['version']}: {ids}")
    skipped = [str(d.get("name")) for d in deps if "skip_reason" in d]
    note = f" ({len(skipped)} NOT CHECKED: {', '.join(skipped[:10])})" if skipped else ""
    print(f"audit-deps: {lock}: {len(vulnerable)} vulnerable of {len(audited)} audited packages{note}")
    if vulnerable or code not in (0, 1):
        return 1
    return unchecked() if skipped else 0


if __name__ == "__main__":
    sys.exit(max(verdict(lock) for lock in LOCKS))
