"""The online world as tests meet it: a local crates.io (flakebot.crates.mirror) made flakebot's crates.io."""

from __future__ import annotations

from flakebot.crates.mirror import Mirror


def online(mirror: Mirror) -> dict[str, str]:
    """Settings (as FLAKEBOT_* variables) that make the mirror flakebot's crates.io; nix builds with the host stand-in."""
    return {
        "FLAKEBOT_CRATESIO_API_URL": mirror.url,
        "FLAKEBOT_CRATESIO_STATIC_URL": mirror.url,
        "FLAKEBOT_CRATESIO_INDEX_URL": f"{mirror.url}/index",
        "FLAKEBOT_CRATESIO_INTERVAL": "0",
        "FLAKEBOT_NIXPKGS": "host",
        "FLAKEBOT_SANDBOX": "required",
    }
