"""Redaction at every sink: the patterns, and the logging filter run.log and the CLI use."""

from __future__ import annotations

import logging

import pytest

from flakebot.errors import NixError
from flakebot.redact import REDACTED, RedactFilter, redact_text


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
