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


# One string each SECRET_PATTERNS redacts, after a newline (a word boundary the JSON text's `\n` escape does not keep)
KEY_SHAPES = [
    "\nsk-abcdef123456",
    "\ngsk_abcdefgh1234",
    "\nghp_abcdefghijklmnopqrstu123",
    "\nfbt_abcdefghijklmnopqrstuv",
    "\nBEARER abcdefgh.ijk",
    "\nhttps://ann:hunter22@git.example.com",
    "\nhost=db PassWord='key-pass-1'",
    "\nhost=db sslpassword=key-pass-1",
]


def test_json_text_said_free_of_secrets_is_what_redaction_would_leave_unchanged(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """atomic_write_json writes a record's JSON as it is when json_may_hold_secrets says nothing in it could be
    redacted (a state.json's walk, seven patterns per string, was most of a craft's state saves): it must never say so
    of data redact() changes, whatever the pattern, the key, or the secret's characters JSON escapes."""
    import json

    from flakebot.redact import SECRET_PATTERNS, json_may_hold_secrets, redact

    assert all(any(pattern.search(shape) for shape in KEY_SHAPES) for pattern in SECRET_PATTERNS), "a shape per pattern"
    monkeypatch.setenv("SOME_TOKEN", 'se"cr\\et-é-value')
    records: list[object] = [{"a": [{"b": shape}]} for shape in KEY_SHAPES]
    records += [{"Token": "plain-word"}, {"x": {"API-KEY": "abc"}}, {"log": 'said se"cr\\et-é-value here'}]
    for record in records:
        text = json.dumps(record, indent=2, sort_keys=True)
        assert redact(record) != record, record
        assert json_may_hold_secrets(text), record
    clean = {"status": "running", "stages": {"spec": {"need": "a csv deduper", "keys": ["token-less"]}}}
    assert redact(clean) == clean and not json_may_hold_secrets(json.dumps(clean, indent=2, sort_keys=True))
