"""Free TCP ports for a worker group's TF_CONFIG (and for tests that start servers).

Picked with portpicker (the seed notes' choice): it checks TCP and UDP on every interface
and never hands out a port it returned before in this process, so the ports of several
workers, or of consecutive attempts, are distinct. A port is free when picked, not
reserved: the worker binds it a second later. A bind that loses that race fails the
attempt, and the gang restart picks new ports.
"""

from __future__ import annotations

import portpicker

__all__ = ["free_ports"]


def free_ports(count: int) -> list[int]:
    """``count`` distinct ports that nothing listens on now."""
    if count < 0:
        raise ValueError(f"Received count={count}; expected >= 0")
    return [portpicker.pick_unused_port() for _ in range(count)]
