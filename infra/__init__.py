"""Infrastructure every layer may use, and that uses none of them.

- ``background``: tasks scheduled beside the request path (audit writes, key refreshes) and their drain.
- ``dbcall``: database calls with a client-side deadline (``bounded``), so a frozen database costs a
  bounded wait and never a stuck thread pool.
- ``metrics``: the Prometheus metrics of every process.
- ``scrub``: the one scrubber for secrets in every outgoing or stored string.
- ``shared_state``: counters, leases, TTL'd values and lists and a broadcast, in Redis when
  ``REDIS_URL`` is set and in process memory otherwise, failing open (limits, revocation, loops).
- ``outbound`` / ``outbound_http``: the outbound address policy and the HTTP clients that enforce it
  at connect time (upstreams, webhooks, model listings).
- ``webhook`` / ``operator_alert``: signed webhook bodies, and the operator's own webhook (no database).

Nothing here imports ``proxy`` (beyond the sans-IO guard), ``tenants``, ``audit`` or ``alerts``.
"""
