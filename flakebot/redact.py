"""Secret redaction at every sink: run.log (RedactFilter), events, state.json, manifests, edit.json
(flakebot.fsutil.atomic_write_json), transcripts, and error messages (FlakebotError). Keys never leave the process.

A secret is the value of an environment variable whose name looks secret (*_KEY, *_APIKEY, *_SECRET,
*_PASSWORD, *_TOKEN, ..., libpq's PGPASSWORD), or a string shaped like a key (sk-..., gsk_..., a bearer token, the
password of a user:pass@ URL, password=... in a URL's query or a libpq connection string) wherever it appears.
"""

from __future__ import annotations

import json
import logging
import os
import re
from typing import Any

from flakebot.modeltext import plain

REDACTED = "[REDACTED]"
# Environment variables whose values are secrets.
SECRET_ENV = re.compile(r"(.*_|^|PG)(KEY|APIKEY|SECRET|PASSWORD|PASSWD|PASS|TOKEN|CREDENTIALS?|AUTH)$")  # PG: libpq's
# Strings that look like keys even when no environment variable holds them.
SECRET_PATTERNS = (
    re.compile(r"\bsk-[A-Za-z0-9_\-]{8,}"),
    re.compile(r"\bgsk_[A-Za-z0-9]{8,}"),
    re.compile(r"\bgh[pousr]_[A-Za-z0-9]{20,}"),
    re.compile(r"\bfbt_[A-Za-z0-9_\-]{20,}"),  # a flakebot team token (flakebot.team.tokens)
    re.compile(r"(?i)(?<=bearer )[A-Za-z0-9._~+/=\-]{8,}"),
    re.compile(r"(?<=://)[^/\s:@]*:[^/\s@]+(?=@)"),  # user:password@host in a URL (or :password@, no user)
    # a URL's ?password=, a libpq key=value string's (quoted: to its closing quote, or to the end when it has none)
    re.compile(r"(?i)(?:(?<=\bpassword=)|(?<=\bsslpassword=))('(?:[^'\\]|\\.)*'?|[^\s&']+)"),
)
SECRET_KEYS = {"authorization", "proxy-authorization", "api_key", "api-key", "x-api-key", "apikey", "password", "token"}
MIN_SECRET_LENGTH = 6  # shorter values ("1", "yes") would redact ordinary text
# What every SECRET_PATTERNS match holds, found in JSON text wherever the data holds it: plain ASCII words (looked for
# in the lowered text, as plain substrings: a regular expression's scan of a state.json cost more than the walk it
# saves), and a URL's user:password@, whose characters JSON escapes without a '/', ':', '@' or space (a URL without a
# password, in most states, is no mark). tests/test_redact.py holds each pattern to one of these.
PATTERN_WORDS = ("sk-", "gsk_", "ghp_", "gho_", "ghu_", "ghs_", "ghr_", "fbt_", "bearer ", "password=")
URL_PASSWORD_MARK = re.compile(r"://[^/\s:@]*:[^/\s@]+@")


def secret_values() -> list[str]:
    """Values of secret-looking environment variables, longest first (so overlaps redact whole).

    Every error message is redacted (errors.py), so this runs several times per failed call: scanning the environment
    through os.environ decodes each name and value (0.3-0.7 ms with ~50 variables, most of an unknown `show` over the
    team front). The answer is kept with a copy of the environment's raw mapping, and made again whenever the
    environment differs from it (one C-level comparison: a variable set, changed or removed is seen at once)."""
    raw = getattr(os.environ, "_data", None)  # CPython's bytes mapping behind os.environ, kept in step with it
    if not isinstance(raw, dict):
        return _secret_values()
    global _kept
    kept = _kept
    if kept is not None and kept[0] == raw:
        return list(kept[1])
    values = _secret_values()
    _kept = (dict(raw), tuple(values))
    return values


_kept: tuple[dict[bytes, bytes], tuple[str, ...]] | None = None  # (the raw environment seen, its secret values)


def _secret_values() -> list[str]:
    values = {v for k, v in os.environ.items() if SECRET_ENV.match(k.upper()) and len(v) >= MIN_SECRET_LENGTH}
    return sorted(values, key=len, reverse=True)


def redact_text(text: str, secrets: list[str] | None = None) -> str:
    """`text` with every known secret and key-looking string replaced by [REDACTED]."""
    for secret in secret_values() if secrets is None else secrets:
        text = text.replace(secret, REDACTED)
    for pattern in SECRET_PATTERNS:
        text = pattern.sub(REDACTED, text)
    return text


def json_may_hold_secrets(text: str, secrets: list[str] | None = None) -> bool:
    """Whether redact() could change the data `text` holds (JSON as json.dumps writes it, ASCII-escaped): False when
    no pattern's literal part, no secret-named key and no secret's JSON form appears in the text, which is then written
    as it is. A state.json's walk string by string, seven patterns each, was most of a craft's state saves."""
    lowered = text.lower()
    if any(word in lowered for word in PATTERN_WORDS) or any(f'"{key}"' in lowered for key in SECRET_KEYS):
        return True
    if URL_PASSWORD_MARK.search(text):
        return True
    return any(json.dumps(secret)[1:-1] in text for secret in (secret_values() if secrets is None else secrets))


def redact(value: Any, secrets: list[str] | None = None) -> Any:
    """A copy of `value` (JSON-like data) with secrets redacted, including Authorization-like keys."""
    secrets = secret_values() if secrets is None else secrets
    if isinstance(value, str):
        return redact_text(value, secrets)
    if isinstance(value, dict):
        return {
            k: REDACTED if str(k).lower() in SECRET_KEYS and isinstance(v, str) else redact(v, secrets)
            for k, v in value.items()
        }
    if isinstance(value, (list, tuple)):
        return [redact(v, secrets) for v in value]
    return value


class RedactFilter(logging.Filter):
    """The filter every log handler has (terminal, run.log, the MCP server's stderr): each record's final message
    (arguments merged in) redacted, and rendered as data (flakebot.modeltext.plain: no terminal escapes, bells,
    carriage returns or bidi overrides), since a message may quote others' text (a name a tool chose, a catalog's
    words) and a log line ends on a terminal or in an agent's context."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        record.msg, record.args = plain(redact_text(message)), None
        if record.exc_text:
            record.exc_text = plain(redact_text(record.exc_text))
        return True
