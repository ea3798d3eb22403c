"""Limits and the state they share across processes.

``proxy.limits.state``: the shared-state interface (counters, leases, remembered values, a broadcast)
with a Redis and an in-process implementation; ``get_state()`` is the process's one instance.
``proxy.limits.enforce``: the per-request check of a principal's limits.
"""

from proxy.limits.state import (
    Lease,
    MemoryState,
    RedisState,
    SharedState,
    Verdict,
    Window,
    WindowUsage,
    get_state,
    reset_state,
)

__all__ = ["Lease", "MemoryState", "RedisState", "SharedState", "Verdict", "Window", "WindowUsage", "get_state",
           "reset_state"]
