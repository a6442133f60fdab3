"""Grants: where a caller may let a tool write, decided by an allow list the user owns.

A caller (an agent over MCP, a command line someone else composed) names the paths a tool may write (`--writable`,
MCP `writable`). The user names the roots those paths must lie beneath: the trusted setting grant_roots (default
".": the directory the command, or the MCP server, started in), widened by `--grant-root DIR` on `flakebot run` and
`flakebot mcp`; no MCP argument can name one. The allow list decides first: a path outside every root is refused,
whatever it is, so no deny list has to name every directory some program reads.

A root is never a directory flakebot or the system reads configuration from: one that is, holds or lies inside such
a directory is dropped (and named when a grant is refused), so a server started in / or in a home directory has no
default root at all rather than everything under it. Configuration directories: the system's trees (/etc, /usr,
/nix, /boot, /var/lib, /var/spool, /opt, ...), every home directory as a whole (/root too: the shell and git read its
dotfiles) and every dot entry in one (~/.config, ~/.local, ~/.ssh, ~/.cargo, ...), the XDG base directories,
rustup's and cargo's homes, and flakebot's own directories (Settings.own_dirs). A root with a part a host program
reads as configuration (trust.steering_name: .git, .cargo, ...) is refused too.

Both sides are resolved before the check (symlinks followed, '..' folded): a link inside a root pointing at /etc
names /etc, which lies beneath no root. A mount is another tree under the root's spelling (no resolving shows it):
a path that lies on, or holds, a mount point beneath its root (the root's own mount aside) is refused.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import pwd
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from flakebot import config
from flakebot.errors import UsageError
from flakebot.trust import steering_name

# Trees the system reads configuration or programs from (nix.conf and its hooks, cron, systemd units, profile.d, apt,
# sudoers, PATH, boot): a root may neither lie inside one nor hold one. Host state is never a root either.
SYSTEM_TREES = ("/etc", "/usr", "/nix", "/boot", "/var/lib", "/var/spool", "/var/db", "/opt",
                "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/snap",
                "/proc", "/sys", "/dev", "/run", "/var/run")  # fmt: skip


@dataclass(frozen=True)
class Grants:
    """The roots a tool's writable paths must lie beneath (resolved, each checked), and the roots refused with why."""

    roots: tuple[Path, ...]
    refused: tuple[tuple[str, str], ...] = ()

    def check(self, text: str, source: Path) -> Path:
        """The outermost root the writable path `text` (resolved: `source`) lies beneath; refused when there is none."""
        beneath = sorted((root for root in self.roots if source.is_relative_to(root)), key=lambda r: len(r.parts))
        if beneath:
            _refuse_mounts(text, source, beneath[0])
            return beneath[0]
        allowed = ", ".join(str(root) for root in self.roots) or "none"
        refused = "".join(f"; root {name} refused: {why}" for name, why in self.refused)
        raise UsageError(
            f"writable path '{text}' is {source}, outside every grant root (grant_roots: {allowed}{refused})",
            fix="run from a directory that holds it (not a configuration directory), or let the tool write beneath "
            "another directory of yours: --grant-root DIR (flakebot run, flakebot mcp) or flakebot config set "
            "grant_roots DIR",
        )


def _refuse_mounts(text: str, source: Path, root: Path) -> None:
    """Refuse `source` when it lies on, or holds, a mount point beneath `root` (the root's own mount aside): a mount is
    another tree under the root's spelling (a bind of /etc/cron.d, a container's volume), so lying beneath the root
    says nothing of where the writes land."""
    for point in _mount_points():
        if (
            point != root
            and point.is_relative_to(root)
            and (source.is_relative_to(point) or point.is_relative_to(source))
        ):
            how = "lies on" if source.is_relative_to(point) else "holds"
            raise UsageError(
                f"writable path '{text}' is {source}, which {how} the mount point {point} beneath the grant root "
                f"{root}: a mounted tree is not the root's, whatever its path",
                fix="let the tool write a directory on the root's own file system (not a mount point or one holding "
                "one), e.g. --writable ./out",
            )


def _mount_points() -> list[Path]:
    """Every mount point this process sees (/proc/self/mountinfo's fifth field, octal escapes undone)."""
    try:
        text = Path("/proc/self/mountinfo").read_text(errors="surrogateescape")
    except OSError:
        return []
    fields = (line.split(" ") for line in text.splitlines())
    return [Path(_OCTAL.sub(lambda m: chr(int(m.group(1), 8)), parts[4])) for parts in fields if len(parts) > 4]


_OCTAL = re.compile(r"\\([0-7]{3})")


def widened(settings: config.Settings, roots: Sequence[str]) -> config.Settings:
    """`settings` with the roots `--grant-root` names added to grant_roots (a flag widens the setting)."""
    if not roots:
        return settings
    return dataclasses.replace(settings, grant_roots=(*settings.grant_roots, *roots))


def check_flag_roots(roots: Sequence[str], settings: config.Settings, start: Path) -> None:
    """The roots a user's --grant-root flags name, refused at once (a UsageError naming the first and why) when one
    could never be a grant root: else a server would start and refuse every call that writes there."""
    for text in roots:
        _, why = _resolved(text, settings, start)
        if why:
            raise UsageError(
                f"--grant-root {text[:200]!r} refused: {why}",
                fix="pass --grant-root DIR with a directory of yours that exists and holds no configuration "
                "(the grant_roots setting takes the same)",
            )


def grants(settings: config.Settings, start: Path) -> Grants:
    """The grant roots of `settings`, relative ones from `start` (where the command or the MCP server started)."""
    roots: list[Path] = []
    refused: list[tuple[str, str]] = []
    for text in settings.grant_roots:
        root, why = _resolved(text, settings, start)
        if root is None or why:
            name = f"{text} ({root})" if root is not None and text != str(root) else text[:200]
            refused.append((name, why))
        else:
            roots.append(root)
    return Grants(tuple(dict.fromkeys(roots)), tuple(refused))


def _resolved(text: str, settings: config.Settings, start: Path) -> tuple[Path | None, str]:
    """Grant root `text` resolved from `start`, and why it cannot be one ("" when it can)."""
    try:
        root = Path(os.path.realpath(start / Path(text).expanduser()))
        return root, (root_refusal(root, settings) if root.is_dir() else "it is not an existing directory")
    except (OSError, RuntimeError, ValueError) as exc:  # too long a name, ~no-such-user, a NUL byte
        return None, f"it cannot be looked up ({exc.strerror if isinstance(exc, OSError) else exc})"


def root_refusal(root: Path, settings: config.Settings) -> str:
    """Why the resolved directory `root` may not be a grant root; '' when it may."""
    for tree in _config_trees(settings):
        if root.is_relative_to(tree) or tree.is_relative_to(root):
            return f"it is, holds or lies in {tree}, a directory programs read configuration from"
    for home in _homes():
        if home.is_relative_to(root):
            return f"it is or holds the home directory {home} (its dotfiles are configuration)"
        if root.is_relative_to(home) and root.relative_to(home).parts[0].startswith("."):
            return f"it lies in {home / root.relative_to(home).parts[0]}, a home's configuration"
    reader = steering_name(root)
    if reader:
        return f"it is read as configuration by {reader}"
    return ""


def _config_trees(settings: config.Settings) -> list[Path]:
    """Every directory tree configuration is read from: the system's, the XDG bases, rustup's and cargo's homes,
    flakebot's own."""
    bases = [config.config_home().parent, config.data_home().parent, config.state_home().parent]
    bases += [config.cache_home().parent, config.rustup_home(), Path.home() / ".cargo"]
    bases += [Path(os.environ["CARGO_HOME"])] if os.environ.get("CARGO_HOME") else []
    found = [Path(os.path.realpath(p)) for p in (*(Path(t) for t in SYSTEM_TREES), *bases, *settings.own_dirs())]
    return list(dict.fromkeys(found))


@functools.cache
def _homes() -> tuple[Path, ...]:
    """Every user's home directory (the passwd database's and $HOME), resolved."""
    homes = [Path.home(), *(Path(entry.pw_dir) for entry in pwd.getpwall() if entry.pw_dir.startswith("/"))]
    return tuple(dict.fromkeys(Path(os.path.realpath(home)) for home in homes))
