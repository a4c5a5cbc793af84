"""Process environment Ray must see before it is imported: a loopback-only local runtime, and token
authentication for joined clusters."""

from __future__ import annotations

import os
from pathlib import Path


def prepare_ray_env(address: str | None) -> None:
    """Call before Ray is imported (Ray reads these settings once, at import)."""
    if address is None:
        _loopback_only()
    else:
        _token_auth_if_available()


def _loopback_only() -> None:
    """Make the sweep's own local Ray runtime listen on 127.0.0.1 only.

    On Linux, Ray resolves a loopback node address (`_node_ip_address="127.0.0.1"`) to the host's
    routable address, and its GCS, raylet, worker and agent servers then listen on every interface.
    With `RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0` (Ray's switch for single-machine runtimes) the node
    address stays 127.0.0.1 and every server binds to it (checked on Ray 2.60). A local runtime has
    no other node to talk to, so nothing is lost. A value the user set is kept.
    """
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")


def _token_auth_if_available() -> None:
    """Send Ray's auth token when one is configured, as `ray.init(address="auto")` does.

    Ray enables token authentication on clusters it starts when a token exists (`~/.ray/auth_token`,
    `RAY_AUTH_TOKEN`, `RAY_AUTH_TOKEN_PATH`), but a driver given an explicit address does not send
    it unless `RAY_AUTH_MODE=token`. A token-mode driver connects to a cluster started without
    auth, but that cluster cancels every actor it creates (Ray 2.60); `ShardPool` turns that into a
    clear error, and `RAY_AUTH_MODE=disabled` in the driver's environment is the fix.
    """
    if "RAY_AUTH_MODE" in os.environ:
        return
    if os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH") \
            or (Path.home() / ".ray" / "auth_token").exists():
        os.environ["RAY_AUTH_MODE"] = "token"
