"""Which team database `serve`, `worker` and `quota` use, with its password kept off every command line.

A process's arguments are readable by every local user (`ps`, /proc/PID/cmdline), so a `--database` holding a
password is refused in one line that names the ways that keep it private: the whole URL in FLAKEBOT_DATABASE_URL
(a process's environment is readable by its own user only, and flakebot's children never get this variable:
flakebot.launcher), or the password in libpq's own ~/.pgpass, PGPASSFILE or service file beside a password-less URL.
"""

from __future__ import annotations

import os

from flakebot.errors import UsageError

ENV = "FLAKEBOT_DATABASE_URL"
SECRETS = ("password", "sslpassword")  # libpq's keywords holding a secret: the server's, the client key's
FIX = (
    f"put the whole URL in the environment variable {ENV} and leave --database out, or keep the password in "
    "~/.pgpass (or PGPASSFILE) and pass the URL without it"
)


def chosen(given: str | None) -> str | None:
    """The database to use: `given` (a flag's value; refused when it holds a password), else FLAKEBOT_DATABASE_URL,
    else None (no flag, no variable: `serve` queues nothing; `worker` and `quota` take "" as libpq's PG* variables)."""
    if given is not None and given != "":
        if passwords(given, flag=True):
            raise UsageError(
                "--database holds a password, which every user of this machine can read in ps and /proc/PID/cmdline",
                fix=FIX,
            )
        return given
    from_env = os.environ.get(ENV, "")
    return from_env if from_env else given


def passwords(url: str, *, flag: bool = False) -> list[str]:
    """The secrets a URL or libpq connection string carries, its password and its client key's sslpassword ([]:
    none, or libpq cannot parse it). `flag`: an unparseable value is refused in one line that does not echo it (it
    may hold a password)."""
    found = parsed(url)
    if found is None:
        if flag:
            raise UsageError(
                "--database is not a PostgreSQL URL or connection string libpq reads",
                fix="pass postgresql://USER@HOST:PORT/DB (the password in ~/.pgpass), or the URL in " + ENV,
            )
        return []
    return [str(found[key]) for key in SECRETS if found.get(key)]


def parsed(url: str) -> dict[str, str] | None:
    """The URL's or connection string's parameters as libpq reads them; None when libpq cannot read it (its
    message is not kept: it may quote a piece of the password, a bad %-escape or an unterminated quote)."""
    from psycopg import ProgrammingError
    from psycopg.conninfo import conninfo_to_dict

    try:
        return {key: str(value) for key, value in conninfo_to_dict(url).items()}
    except ProgrammingError:
        return None
