"""The process's TLS trust contexts: each HTTP library's default context (its CA bundle, SSL_CERT_FILE and
SSL_CERT_DIR honoured) made once per process, not once per client. Reading the CA bundle takes 35-70 ms, and a
craft makes clients for its model (one per stage when scripted) and, online, one per crates.io request. A context
verifies each connection itself and may serve many clients at once."""

from __future__ import annotations

import os
import ssl
import threading
from collections.abc import Callable
from typing import Any

_TLS: dict[tuple[Any, str | None, str | None], ssl.SSLContext] = {}
_TLS_LOCK = threading.Lock()  # its own: llm.chat.shared_client makes a client holding its lock


def tls_context(make: Callable[[], ssl.SSLContext]) -> ssl.SSLContext:
    """The TLS context `make` (an HTTP library's create_ssl_context: the one its clients make by default) builds, made
    once per process and library, and again when SSL_CERT_FILE or SSL_CERT_DIR names another trust store: the same
    trust a client made by default has, read once."""
    key = (make, os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR"))
    with _TLS_LOCK:
        if key not in _TLS:
            _TLS[key] = make()
        return _TLS[key]
