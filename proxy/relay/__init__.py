"""The request, once routed: one attempt loop (``loop.Relay``) over small path strategies (``paths``:
pass-through, guarded, non-stream), the attempt records (``attempts``), and the validation worker
processes for costly schemas (``schema_pool``)."""
