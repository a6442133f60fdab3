"""Attacks on a waited craft's following of its queued job (docs/team.md, "A waited craft whose caller went away"):
each end of the call before its job's retracts that call's own following, whatever ended it. Real fronts, a real
PostgreSQL, the MCP SDK's client over HTTP."""

from __future__ import annotations

import time
from pathlib import Path

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from flakebot.team import audit
from flakebot.team.idtokens import LEEWAY_SECONDS
from tests.conftest import wait_for
from tests.team.test_front import add_token, serving
from tests.team.test_jwt import AUDIENCE, ISSUER, claims
from tests.team.test_serve_queue import _audited, call, handle_of, rows

pytestmark = pytest.mark.timeout(300)


def test_a_waited_craft_whose_jwt_expired_while_it_waited_leaves_no_job_for_nobody(
    flakebot_home: Path, database: str, workdir: Path
) -> None:
    """carol's JWT expires while her craft (wait: true) waits on its job. Her call then read the job as her token no
    longer could: "no job 'job-1' (unknown here...)", an error raised, not a cancel, so her following of the job was
    never retracted and the job, hers alone, stayed queued for nobody (a worker would craft it); and the call was not
    audited at all (its principal was looked up again at its end). Now any end of a waited call before its job's
    retracts its own following (here the job is cancelled: she alone followed it), the answer says why in one line,
    and the call is audited under the principal it was admitted as."""
    private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    key_file = flakebot_home / "idp.pem"
    key_file.write_bytes(
        private.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    add_token("alice", "--tenant", "acme")
    expires = int(time.time()) - LEEWAY_SECONDS + 6  # valid for the next ~6 s, the front's leeway counted
    carol = jwt.encode(claims(exp=expires), private, algorithm="RS256")
    options = ["--jwt-issuer", ISSUER, "--jwt-audience", AUDIENCE, "--jwt-key", str(key_file)]
    with serving(*options, log=flakebot_home / "serve.log", database=database) as url:
        answer = call(url, carol, "craft", {"need": "need a csv deduper", "wait": True})
        assert answer["is_error"], answer
        assert "unknown here" not in answer["error"] and "no longer valid" in answer["error"], answer
        assert answer["fix"], answer
        job = handle_of(rows(database)[0])
        wait_for(lambda: {handle_of(r): r["state"] for r in rows(database)}[job] == "cancelled", timeout=30)
    assert _audited(database) == [("carol@example.test", "enqueued"), ("carol@example.test", "cancelled")]
    crafts = [r for r in audit.read(workdir) if r["method"] == "tools/call" and r["tool"] == "craft"]
    assert [(r["principal"], r["outcome"]) for r in crafts] == [("carol@example.test", "error")], crafts
