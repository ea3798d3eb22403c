"""Routing over a fleet of upstreams: credential pools and per-upstream circuit breaking (``docs/routing.md``)."""
