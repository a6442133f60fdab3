"""What a hosted provider serves now: its `/models` list, asked through the provider's own SDK.

`flakebot models` shows it beside the configured default, so a default the provider retired is seen before a craft
fails on it.
"""

from __future__ import annotations

import logging

from flakebot.llm.chat import Endpoint, make_client

logger = logging.getLogger(__name__)


def served_models(endpoint: Endpoint, timeout: float) -> tuple[list[str], str]:
    """(model ids the provider lists, '') or ([], why it could not be asked); never raises for the network."""
    module, client = make_client(endpoint, timeout, retries=0)
    try:
        return sorted(model.id for model in client.models.list().data), ""  # groq: a list response; openai: a page
    except module.APIError as exc:
        logger.info("cannot list %s's models: %s", endpoint.provider, exc)
        return [], f"cannot list {endpoint.provider}'s models: {' '.join(str(exc).split())[:200]}"
    finally:
        client.close()
