"""A fault-injecting OpenAI-compatible upstream for the demo, the end-to-end tests and benchmarks.

Endpoints: ``POST /v1/chat/completions`` (also ``/chat/completions``; query strings ignored),
``GET /v1/models``, and the control endpoints ``GET /_sim/stats`` and ``POST /_sim/reset``.

Scenario selection: the ``x-sim-scenario`` header, else the request's ``model``. Grammar (full
reference with examples in ``docs/simulator.md``)::

    scenario := mode ["=" value] (":" segment)*        segment := value | key "=" value

    case:C14[:broken=N][:ttft=MS][:frame=MS]   replay fault case C14 (raw_sse bytes exactly, else
                                               "data: X\\n\\n" per upstream_chunks; upstream_http as
                                               is); with broken=N: the first N attempts broken,
                                               then a clean stream of the case's expected turn
    gen[:key=value]...                         generated turn fitting the request's tools;
                                               corrupt=P kinds=a,b[/variant] ttft=MS frame=MS
                                               frames=N calls=N seed=S text=0|1 reasoning=0|1
                                               broken=N (first N attempts corrupted, then clean)
    text:N[:frame=MS][:ttft=MS]                tool-less stream of N content frames
    slow:N[:frame=MS]                          long paced text stream (frame default 100 ms)
    http:STATUS[:retry-after=S][:broken=N]     HTTP error (429, 500, 503, 400, ...), then clean gen
    stall-first-byte=MS[:broken=N]             nothing at all for MS, then a clean gen stream
    stall-after=K[:ms=MS][:broken=N]           K frames, a pause of MS (default 1000), the rest
    drop-after=K[:broken=N]                    K frames, then the TCP connection closes (no
                                               chunked terminator, no [DONE])
    gen:calls=1:http:500:broken=1              a failure mode after gen options: that mode, over
                                               a gen turn with those options
    gen:refuse=deepseek-max-tokens/8192        refuse a request parameter as that upstream family
                                               does (proxy/simulator/refusals.py), else answer

Anything else (``gpt-4o``, ``deepseek-chat``) is ``gen`` with the server defaults
(``--corruption-rate``, ``--kinds``, ``--ttft-ms``, ``--frame-ms``, ``--seed``). Attempts are
counted per (scenario text, sha256 of ``messages``).

Python API::

    sim = start_in_thread(port=0, corruption_rate=0.0)   # RunningSimulator
    sim.url, sim.port, sim.stats(), sim.reset(), sim.stop()
    await serve("127.0.0.1", 8001, kinds="mid-stream-error-chunk")   # until cancelled

No Django imports here: ``python -m proxy.simulator --port 8001`` runs without settings.
"""

from __future__ import annotations

from proxy.simulator.faults import FAULTS
from proxy.simulator.planner import SimConfig
from proxy.simulator.server import RunningSimulator, Simulator, make_config, serve, start_in_thread

__all__ = ["FAULTS", "RunningSimulator", "SimConfig", "Simulator", "make_config", "serve", "start_in_thread"]
