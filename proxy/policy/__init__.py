"""What a request may spend: its key's and tenant's limits (``limits``: admission, settlement, the
concurrency queue), the tenant's retry budget for broken output (``retry_budget``) and the loop breaker
across an agent's requests (``loop_breaker``), all on ``infra.shared_state``."""
