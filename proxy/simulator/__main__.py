"""``python -m proxy.simulator --port P``: the simulator without Django."""

from __future__ import annotations

from proxy.simulator.cli import main

if __name__ == "__main__":
    main()
