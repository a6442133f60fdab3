"""One HTTP request to a running service, for an agent with no network of its own (the MCP `service_request` tool).

It goes to 127.0.0.1 and the host port flakebot's own launch.json gives the service (written by `up`, beside the
service's state directory, out of the service's reach), and nowhere else. The caller names a path, never a URL: it
must start with "/" and hold printable ASCII only (no space, CR, LF or "#"), so no scheme, authority or second
request line can ride on it; the URL is built from parts and its host and port checked again; redirects are handed
back, never followed; proxies named by the environment are ignored. Only a service whose supervisor is alive and
which is running is asked (the port of a stopped one may belong to another program by now). The body sent, the
answer read and the whole exchange's time are bounded.
"""

from __future__ import annotations

import logging
import re
import time
from typing import Any

import httpx

from flakebot.config import Settings
from flakebot.errors import UsageError
from flakebot.services.layout import ServiceDir
from flakebot.services.supervised import show

logger = logging.getLogger(__name__)

METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
PATH = re.compile(r"^/[\x21-\x22\x24-\x7e]{0,2047}$")  # printable ASCII but "#", no space: one request-target
CONTENT_TYPE = re.compile(r"^[\x20-\x7e]{1,200}$")
MAX_BODY = 1024 * 1024  # bytes sent at most
MAX_ANSWER = 1024 * 1024  # bytes of an answer read at most (the rest is cut: truncated)
DEFAULT_TIMEOUT = 10.0
MAX_TIMEOUT = 60.0  # seconds for the whole exchange


def request(
    name: str,
    settings: Settings,
    method: str,
    path: str,
    *,
    body: str = "",
    content_type: str | None = None,
    timeout: float = DEFAULT_TIMEOUT,
) -> dict[str, Any]:
    """Send `method path` (with `body`) to running service `name` on 127.0.0.1; its answer: status, content type,
    body (text; at most MAX_ANSWER bytes, `truncated` past it), `timed_out` when the deadline cut it."""
    where = ServiceDir.of(name, settings)
    method = method.upper()
    if method not in METHODS:
        raise UsageError(f"method {method[:20]!r} is not sent to services", fix=f"use one of {', '.join(METHODS)}")
    if not PATH.match(path):
        raise UsageError(
            f"{path[:80]!r} is not a path on the service",
            fix="pass a path starting with '/', printable ASCII without spaces or '#' (percent-encode the rest), "
            "at most 2048 characters; the host and port are the service's own",
        )
    if not 0 < timeout <= MAX_TIMEOUT:
        raise UsageError(f"timeout {timeout:g} s is out of range", fix=f"pass 0 < timeout <= {MAX_TIMEOUT:g}")
    data = body.encode()
    if len(data) > MAX_BODY:
        raise UsageError(f"the body is {len(data):,} bytes, more than {MAX_BODY:,}", fix="send less at a time")
    if content_type is not None and not CONTENT_TYPE.match(content_type):
        raise UsageError("content_type is not one printable header value", fix="e.g. application/json")
    port = service_port(where)
    url = httpx.URL(scheme="http", host="127.0.0.1", port=port, raw_path=path.encode("ascii"))
    if url.host != "127.0.0.1" or url.port != port:  # built from parts; checked anyway
        raise UsageError(f"{path[:80]!r} does not stay on the service's port", fix="pass a plain path")
    headers = {"Content-Type": content_type} if content_type else {}
    return _send(method, url, data, headers, timeout)


def service_port(where: ServiceDir) -> int:
    """The host port of service `where` when it is running under a live supervisor, from flakebot's launch.json."""
    if not where.status():
        raise UsageError(f"no service {where.name} was started here", fix="list services with the services tool")
    status = show(where)
    if status.get("state") not in ("running", "starting") or not status.get("supervised"):
        raise UsageError(
            f"service {where.name} is not running ({status.get('state')})", fix=f"start it first: up {where.name}"
        )
    port = where.read_json(where.launch_file).get("host_port")
    if not isinstance(port, int) or not 1024 <= port <= 65535 or port != status.get("port"):
        raise UsageError(f"service {where.name} has no port on record", fix=f"restart it: down, then up {where.name}")
    return port


def _send(method: str, url: httpx.URL, data: bytes, headers: dict[str, str], timeout: float) -> dict[str, Any]:
    began = time.monotonic()
    deadline = began + timeout
    body, truncated, timed_out = b"", False, False
    # Plain http to 127.0.0.1 only (the URL's scheme is fixed above): no TLS, so no certificate store to load, which
    # is most of a client's start (17-40 ms here, against 1 ms).
    with httpx.Client(trust_env=False, timeout=timeout, follow_redirects=False, verify=False) as client:
        try:
            with client.stream(method, url, content=data, headers=headers) as answer:
                for chunk in answer.iter_raw():
                    body += chunk
                    if len(body) > MAX_ANSWER:
                        body, truncated = body[:MAX_ANSWER], True
                        break
                    if time.monotonic() > deadline:  # a service that drips bytes: the whole exchange is bounded
                        timed_out = True
                        break
        except httpx.TimeoutException:
            raise UsageError(
                f"the service did not answer within {timeout:g} s", fix="try again, or read its logs"
            ) from None
        except httpx.HTTPError as exc:
            raise UsageError(
                f"the request failed: {type(exc).__name__}: {exc}", fix="read the service's logs"
            ) from None
    logger.info("%s %s -> %d (%d bytes)", method, url.raw_path.decode(), answer.status_code, len(body))
    return {
        "status": answer.status_code,
        "content_type": answer.headers.get("content-type", ""),
        "body": body.decode("utf-8", "replace"),
        "bytes": len(body),
        "truncated": truncated,
        "timed_out": timed_out,
        "seconds": round(time.monotonic() - began, 3),
    }


__all__ = ["MAX_ANSWER", "MAX_BODY", "request", "service_port"]
