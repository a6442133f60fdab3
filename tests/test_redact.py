"""Redaction at every sink: the patterns, and the logging filter run.log and the CLI use."""

from __future__ import annotations

import logging

import pytest

from flakebot.errors import NixError
from flakebot.redact import REDACTED, RedactFilter, redact_text, secret_values


@pytest.mark.parametrize(
    "name",
    [
        "ANTHROPIC_API_KEY",
        "MY_APIKEY",
        "SERVICE_KEY",
        "DB_PASSWORD",
        "AWS_SECRET",
        "NPM_TOKEN",
        "HF_TOKEN",
        "PGPASSWORD",
    ],
)
def test_secret_looking_variables_are_redacted(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    monkeypatch.setenv(name, "s3cr3t-value-123")
    assert redact_text("got s3cr3t-value-123 back") == f"got {REDACTED} back"


def test_url_passwords_and_key_shapes_are_redacted() -> None:
    text = "fetch https://ann:hunter22@git.example.com/x.git with ghp_abcdefghijklmnopqrstu123 and sk-abcdef123456"
    assert redact_text(text) == f"fetch https://{REDACTED}@git.example.com/x.git with {REDACTED} and {REDACTED}"


def test_every_password_a_libpq_connection_string_takes_is_redacted() -> None:
    for given in (
        "postgresql://u@db/x?sslpassword=key-pass-1&sslmode=require",
        "host=db sslpassword=key-pass-1",
        "host=db password='key-pass-1",  # its closing quote missing (libpq refuses it; a log line may hold it)
    ):
        assert "key-pass-1" not in redact_text(given), given


def test_the_log_filter_redacts_arguments_and_tracebacks(
    monkeypatch: pytest.MonkeyPatch, tmp_path: pytest.TempPathFactory
) -> None:
    monkeypatch.setenv("SOME_SERVICE_KEY", "planted-key-0123456789")
    path = tmp_path / "run.log"  # type: ignore[operator]
    handler = logging.FileHandler(path)
    handler.addFilter(RedactFilter())
    log = logging.getLogger("flakebot.test_redact")
    log.addHandler(handler)
    try:
        log.warning("key is %s", "planted-key-0123456789")
        try:
            raise ValueError("planted-key-0123456789")
        except ValueError:
            log.exception("failed")
    finally:
        log.removeHandler(handler)
        handler.close()
    text = path.read_text()
    assert "planted-key" not in text and text.startswith(f"key is {REDACTED}") and f"ValueError: {REDACTED}" in text


def test_error_messages_are_redacted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GROQ_API_KEY", "gsk_plantedplanted")
    error = NixError(
        "build said gsk_plantedplanted", fix="unset gsk_plantedplanted", log_tail="... gsk_plantedplanted ..."
    )
    assert "planted" not in error.one_line() + str(error.to_dict())


def test_a_secret_set_changed_or_removed_after_a_redaction_is_seen(monkeypatch: pytest.MonkeyPatch) -> None:
    """secret_values() keeps its answer while the environment is unchanged: a variable set, changed or removed
    afterwards must still decide the next redaction."""
    assert "late-secret-0123" not in secret_values()
    monkeypatch.setenv("LATE_SERVICE_TOKEN", "late-secret-0123")
    assert redact_text("a late-secret-0123 b") == f"a {REDACTED} b"
    monkeypatch.setenv("LATE_SERVICE_TOKEN", "later-secret-4567")
    assert redact_text("late-secret-0123 later-secret-4567") == f"late-secret-0123 {REDACTED}"
    monkeypatch.delenv("LATE_SERVICE_TOKEN")
    assert "later-secret-4567" not in secret_values()
    assert redact_text("later-secret-4567") == "later-secret-4567"
