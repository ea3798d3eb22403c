"""What faces the upstreams: the process's one HTTP client and the body it sends (``client``), the
refusal table (``refusals``) and what was learned from refusals (``learned``), the upstream's own model
list (``listing``), and the hop count that stops a proxy loop (``hops``)."""
