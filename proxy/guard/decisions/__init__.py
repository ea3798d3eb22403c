"""The decisions family: one attempt's decision (``attempt``), what a client has been sent and may
still get (``delivery``), what it gets when attempts run out (``answer``), and whether a turn completes
an agent loop (``loops``)."""
