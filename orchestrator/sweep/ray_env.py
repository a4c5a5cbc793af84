"""Process environment Ray must see before it is imported: token authentication for joined clusters."""

from __future__ import annotations

import os
from pathlib import Path


def prepare_ray_env(address: str | None) -> None:
    """Call before Ray is imported (Ray reads its auth mode once)."""
    if address is not None:
        _token_auth_if_available()


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
