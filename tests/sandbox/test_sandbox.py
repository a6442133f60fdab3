"""The sandbox with the real bubblewrap: escapes contained, limits enforced, fallbacks explained."""

from __future__ import annotations

import dataclasses
import logging
import os
import pwd
import secrets
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from benchmarks.scenarios.escape_cases import CASES, MARKER_VAR, marked_processes, run_escape_cases
from flakebot import probecache
from flakebot.errors import SandboxError
from flakebot.sandbox import BwrapSandbox, PlainSandbox, open_sandbox, probed
from flakebot.sandbox.bubblewrap import real_root
from flakebot.sandbox.process import SandboxLimits, Spill
from tests.conftest import require


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    return workspace


@pytest.fixture
def target(tmp_path: Path) -> Path:
    return tmp_path / "target"


def bwrap_sandbox(ws: Path, target: Path, **kwargs: object) -> BwrapSandbox:
    require("bwrap")
    kwargs.setdefault("adopt", True)  # the edit loop's sandbox: flakebot's own workspace and target dir
    sandbox = open_sandbox("required", workspace=ws, writable=[target], **kwargs)  # type: ignore[arg-type]
    assert isinstance(sandbox, BwrapSandbox)
    return sandbox


def _print_cases(results: list[dict[str, object]]) -> None:
    for r in results:
        verdict = "CONTAINED" if r["contained"] else "ESCAPED"
        print(f"[{r['sandbox']}] {r['case']}: tried to {r['attempt']} -> {verdict}: {r['outcome']}")


@pytest.mark.slow
def test_escape_attempts_are_contained_by_bubblewrap() -> None:
    require("bwrap")
    results = run_escape_cases(
        lambda ws, writable: open_sandbox("required", workspace=ws, writable=writable, timeout=30, adopt=True)
    )
    _print_cases(results)
    assert [r["case"] for r in results] == [c.name for c in CASES]
    escaped = [r for r in results if not r["contained"]]
    assert not escaped, escaped


@pytest.mark.slow
def test_the_same_attempts_escape_a_plain_process() -> None:
    """The judges detect escapes: without bubblewrap these attempts succeed (the fork bomb is left out)."""
    names = ["network", "write-outside", "git-hook", "read-home", "daemon", "kill-host-process"]
    before = set(Path.home().glob(".flakebot-escape-*"))  # another run's, killed before its tear-down: not ours
    results = run_escape_cases(
        lambda ws, writable: open_sandbox("off", workspace=ws, writable=writable, timeout=30), names
    )
    _print_cases(results)
    assert {r["case"]: r["contained"] for r in results} == dict.fromkeys(names, False)
    assert set(Path.home().glob(".flakebot-escape-*")) <= before, "the cases clean up after themselves"


def test_timeout_kills_the_whole_tree(ws: Path, target: Path) -> None:
    sandbox = bwrap_sandbox(ws, target)
    script = "sleep 300 & (setsid sleep 300 &) ; echo started; wait"
    result = sandbox.run(["bash", "-c", script], cwd=ws, env={MARKER_VAR: "tree"}, timeout=1)
    assert result.timed_out and not result.ok
    assert result.stdout == "started\n"
    assert marked_processes("tree") == []


def test_plain_fallback_kills_its_process_group_at_the_timeout(ws: Path) -> None:
    sandbox = open_sandbox("off", workspace=ws, writable=[])
    result = sandbox.run(
        ["bash", "-c", "sleep 300 & sleep 300 & wait"], cwd=ws, env={MARKER_VAR: "plain-tree"}, timeout=1
    )
    assert result.timed_out
    assert marked_processes("plain-tree") == []


def test_output_cap_keeps_head_and_tail(ws: Path, target: Path) -> None:
    sandbox = bwrap_sandbox(ws, target, output_cap=10_000)
    result = sandbox.run(["seq", "1", "200000"], cwd=ws)
    assert result.ok and result.truncated
    assert result.stdout.startswith("1\n2\n3\n")
    assert result.stdout.endswith("199999\n200000\n")
    assert "bytes dropped by the output cap" in result.stdout
    assert len(result.stdout) < 10_200


def test_spilled_stdout_is_whole_in_memory_or_in_a_file(ws: Path, target: Path, tmp_path: Path) -> None:
    whole = "".join(f"{n}\n" for n in range(1, 200001)).encode()
    spill = Spill(tmp_path / "outputs", limit=len(whole), file_cap=10 * len(whole))
    kept = bwrap_sandbox(ws, target, limits=SandboxLimits(output_cap=1000, spill=spill)).run(["seq", "200000"], cwd=ws)
    assert kept.ok and not kept.truncated and kept.stdout.encode() == whole and not kept.stdout_file
    assert not spill.directory.exists()  # nothing spilled

    small = dataclasses.replace(spill, limit=1000)
    spilled = bwrap_sandbox(ws, target, limits=SandboxLimits(output_cap=1000, spill=small)).run(
        ["seq", "200000"], cwd=ws
    )
    assert spilled.ok and not spilled.truncated and spilled.stdout.encode() == whole[:1000]
    assert Path(spilled.stdout_file).read_bytes() == whole and spilled.stdout_bytes == len(whole)
    assert Path(spilled.stdout_file).parent == spill.directory and Path(spilled.stdout_file).stat().st_mode & 0o077 == 0

    capped = dataclasses.replace(spill, limit=1000, file_cap=100_000)
    endless = bwrap_sandbox(ws, target, limits=SandboxLimits(output_cap=1000, spill=capped)).run(["yes"], cwd=ws)
    assert not endless.ok and endless.truncated and "stdout passed 100000 bytes" in endless.limit
    assert Path(endless.stdout_file).stat().st_size == 100_000


def test_stdin_env_and_no_secrets(ws: Path, target: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-should-not-leak")
    sandbox = bwrap_sandbox(ws, target, output_cap=1_000_000)
    result = sandbox.run(
        ["bash", "-c", "cat; echo; echo $GREETING; env"], cwd=ws, env={"GREETING": "hi"}, stdin="x" * 300_000
    )
    assert result.ok
    lines = result.stdout.splitlines()
    assert lines[0] == "x" * 300_000 and lines[1] == "hi"
    assert "sk-should-not-leak" not in result.stdout


def test_workspace_and_target_writable_git_and_system_read_only(ws: Path, target: Path) -> None:
    subprocess.run(["git", "init", "-q", str(ws)], check=True)
    sandbox = bwrap_sandbox(ws, target)
    script = f"echo a > made.txt && echo b > {target}/built && (echo c > .git/config.new || echo git-ro) && (touch /usr/x 2>/dev/null || echo usr-ro)"
    result = sandbox.run(["bash", "-c", script], cwd=ws)
    assert result.stdout.split() == ["git-ro", "usr-ro"], result
    assert (ws / "made.txt").read_text() == "a\n" and (target / "built").read_text() == "b\n"
    assert not (ws / ".git/config.new").exists()


def test_read_only_permission_keeps_the_workspace_unchanged(ws: Path, target: Path) -> None:
    sandbox = bwrap_sandbox(ws, target, permission="READ_ONLY")
    result = sandbox.run(["bash", "-c", f"touch made.txt; echo built > {target}/out"], cwd=ws)
    assert "Read-only file system" in result.stderr
    assert not (ws / "made.txt").exists()
    assert (target / "out").read_text() == "built\n"


def test_toolchain_usable_inside(ws: Path, target: Path) -> None:
    require("cargo")
    sandbox = bwrap_sandbox(ws, target)
    result = sandbox.run(["cargo", "--version"], cwd=ws)
    assert result.ok, result.stderr
    assert result.stdout.startswith("cargo ")
    assert sandbox.start_overhead is not None and sandbox.start_overhead >= 0


def test_missing_program_and_bad_cwd(ws: Path, target: Path, tmp_path: Path) -> None:
    sandbox = bwrap_sandbox(ws, target)
    assert sandbox.run(["no-such-program-xyz"], cwd=ws).returncode != 0
    with pytest.raises(SandboxError, match="outside the sandbox"):
        sandbox.run(["true"], cwd=tmp_path)
    plain = PlainSandbox(sandbox.limits)
    result = plain.run(["no-such-program-xyz"], cwd=ws)
    assert result.returncode == 127 and "no-such-program-xyz" in result.stderr


def test_a_passed_probe_is_remembered_for_that_bwrap_file_only(
    ws: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A later process trusts the record (no probe) only for the same bwrap file, user and kernel settings."""
    require("bwrap")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    probecache.forget()
    bwrap = shutil.which("bwrap") or "bwrap"
    assert probed.known_working(bwrap) == (False, None)
    sandbox = open_sandbox("required", workspace=ws, writable=[])  # probes, and records the pass
    assert isinstance(sandbox, BwrapSandbox) and sandbox.start_overhead is not None
    probecache.forget()  # as a new process: only the record
    assert probed.known_working(bwrap) == (True, sandbox.start_overhead)
    copy = tmp_path / "bwrap"
    shutil.copy2(bwrap, copy)  # another file (an upgrade, another install): probed again
    assert probed.known_working(str(copy)) == (False, None)


def _tamper(record: Path, how: str) -> None:
    if how == "a link":  # to a file that is this user's alone: the link itself is what is not trusted
        elsewhere = record.with_name("elsewhere.json")
        record.replace(elsewhere)
        record.symlink_to(elsewhere)
    elif how == "another user's":
        os.chown(record, 4242, -1)  # tests run as root
    else:
        record.chmod(0o620 if how == "group-writable" else 0o602)


@pytest.mark.parametrize("how", ["a link", "another user's", "group-writable", "world-writable"])
def test_a_probe_record_another_user_could_plant_is_not_trusted(
    ws: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """A record that is a link, or not this user's alone, would let someone else make flakebot skip the sandbox
    probe: it is ignored, the probe runs again and its record is written anew as this user's own file."""
    require("bwrap")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    probecache.forget()
    bwrap = shutil.which("bwrap") or "bwrap"
    open_sandbox("required", workspace=ws, writable=[])  # probes, and records the pass
    [record] = (tmp_path / "cache").rglob("*.json")
    _tamper(record, how)
    probecache.forget()  # as a new process: only the record
    assert probed.known_working(bwrap) == (False, None)

    sandbox = open_sandbox("required", workspace=ws, writable=[])  # probed again: the record rewritten
    info = record.lstat()
    assert record.is_file() and not record.is_symlink()
    assert (info.st_uid, info.st_mode & 0o777) == (os.geteuid(), 0o600)
    probecache.forget()
    assert probed.known_working(bwrap) == (True, sandbox.start_overhead)


def test_without_bwrap_auto_falls_back_and_required_refuses(
    ws: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for program in ("bash", "true", "sleep"):
        (bin_dir / program).symlink_to(shutil.which(program) or f"/usr/bin/{program}")
    monkeypatch.setenv("PATH", str(bin_dir))
    with pytest.raises(SandboxError) as info:
        open_sandbox("required", workspace=ws, writable=[])
    assert info.value.exit_code == 40
    assert (
        "bubblewrap (bwrap) is not installed" in info.value.one_line()
        and "apt-get install bubblewrap" in info.value.one_line()
    )
    with caplog.at_level(logging.WARNING):
        sandbox = open_sandbox("auto", workspace=ws, writable=[], timeout=1)
    assert sandbox.name == "plain"
    assert "no isolation" in caplog.text
    result = sandbox.run(["sleep", "30"], cwd=ws)
    assert result.timed_out, "the fallback keeps the timeout"


def test_bwrap_present_but_unusable_is_explained(ws: Path) -> None:
    """Inside a namespace that may not create user namespaces, bubblewrap is installed but cannot work."""
    require("bwrap")
    code = textwrap.dedent(
        f"""
        from pathlib import Path
        from flakebot.sandbox import open_sandbox
        from flakebot.errors import SandboxError
        try:
            open_sandbox("required", workspace=Path({str(ws)!r}), writable=[])
        except SandboxError as exc:
            print(exc.exit_code, exc.one_line())
        print("auto:", open_sandbox("auto", workspace=Path({str(ws)!r}), writable=[]).name)
        """
    )
    outer = ["bwrap", "--unshare-user", "--uid", "1000", "--disable-userns", "--dev-bind", "/", "/", "--proc", "/proc"]
    result = subprocess.run(
        [*outer, sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    print(result.stdout, result.stderr)
    lines = result.stdout.splitlines()
    assert lines[0].startswith("40 sandbox required, but bubblewrap cannot create a sandbox here (bwrap: ")
    assert "user namespaces" in lines[0]
    assert lines[1] == "auto: plain"


def test_bad_mode_permission_and_workspace(ws: Path, tmp_path: Path) -> None:
    with pytest.raises(SandboxError, match="unknown sandbox mode"):
        open_sandbox("sometimes", workspace=ws, writable=[])
    with pytest.raises(SandboxError, match="unknown sandbox permission"):
        open_sandbox("auto", workspace=ws, writable=[], permission="WRITE_ALL")
    with pytest.raises(SandboxError, match="is not a directory"):
        open_sandbox("auto", workspace=tmp_path / "missing", writable=[])


def test_off_mode_warns(ws: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        sandbox = open_sandbox("off", workspace=ws, writable=[])
    assert sandbox.name == "off" and "sandbox off" in caplog.text
    assert sandbox.run(["bash", "-c", "echo $HOME"], cwd=ws).stdout.strip() == str(Path.home())


def test_listing_the_workspace_as_writable_changes_nothing(ws: Path, target: Path) -> None:
    """Callers may list the workspace among the writable dirs: .git stays read-only, READ_ONLY stays read-only."""
    require("bwrap")
    subprocess.run(["git", "init", "-q", str(ws)], check=True)
    rw = open_sandbox("required", workspace=ws, writable=[ws, target])
    result = rw.run(["bash", "-c", "echo a > made.txt; echo hook > .git/hooks/pre-commit"], cwd=ws)
    assert (ws / "made.txt").exists() and not (ws / ".git/hooks/pre-commit").exists()
    assert "Read-only file system" in result.stderr
    ro = open_sandbox("required", workspace=ws, writable=[ws, target], permission="READ_ONLY")
    ro.run(["bash", "-c", "echo b > other.txt"], cwd=ws)
    assert not (ws / "other.txt").exists()


HOG = """
import sys
what, mib = sys.argv[1], int(sys.argv[2])
if what == "memory":
    block = bytearray(mib * 1024 * 1024)
    print("allocated", len(block))
else:
    with open(what, "wb") as handle:
        for _ in range(mib):
            handle.write(b"x" * 1024 * 1024)
    print("wrote", mib)
"""


def test_memory_file_size_and_tmp_limits_hold(ws: Path, target: Path) -> None:
    from flakebot.sandbox import SandboxLimits

    sandbox = bwrap_sandbox(ws, target, limits=SandboxLimits(timeout=60, memory_mb=256, file_mb=16, tmp_mb=8))
    memory = sandbox.run(["/usr/bin/python3", "-c", HOG, "memory", "512"], cwd=ws)
    assert memory.returncode != 0 and "MemoryError" in memory.stderr
    big_file = sandbox.run(["/usr/bin/python3", "-c", HOG, str(ws / "big"), "64"], cwd=ws)
    assert big_file.returncode != 0 and (ws / "big").stat().st_size <= 16 * 1024 * 1024
    tmp = sandbox.run(["/usr/bin/python3", "-c", HOG, "/tmp/big", "12"], cwd=ws)
    assert tmp.returncode != 0 and "No space left on device" in tmp.stderr


def test_the_disk_watch_kills_a_command_filling_the_disk(ws: Path, target: Path) -> None:
    from flakebot.sandbox import SandboxLimits

    sandbox = bwrap_sandbox(ws, target, limits=SandboxLimits(timeout=60, file_mb=64, disk_mb=100))
    # 64 paced writes of 16 MiB (1 GiB over at least 13 s): the watch must stop the loop long before its end,
    # however fast or loaded the machine is (an unpaced writer can fill a GiB between two checks).
    script = 'for i in $(seq 64); do head -c 16777216 /dev/zero > "f$i" || exit 1; sleep 0.2; done; echo finished'
    result = sandbox.run(["bash", "-c", script], cwd=ws)
    written = sum(p.stat().st_size for p in ws.iterdir()) // (1024 * 1024)
    assert result.limit.startswith("disk") and not result.ok and "more than 100 MiB" in result.stderr
    assert "finished" not in result.stdout and written < 1024, written


def test_plain_mode_keeps_the_per_process_limits(ws: Path) -> None:
    from flakebot.sandbox import SandboxLimits

    plain = open_sandbox("off", workspace=ws, writable=[], limits=SandboxLimits(timeout=60, memory_mb=256))
    result = plain.run([sys.executable, "-c", HOG, "memory", "512"], cwd=ws)
    assert result.returncode != 0 and "MemoryError" in result.stderr


def test_a_frozen_file_is_read_only_inside_the_writable_workspace(ws: Path, target: Path) -> None:
    (ws / "tests").mkdir()
    frozen = ws / "tests/acceptance.rs"
    frozen.write_text("fn frozen() {}\n")
    sandbox = bwrap_sandbox(ws, target, frozen=[frozen])
    result = sandbox.run(
        ["bash", "-c", "echo x > tests/acceptance.rs; rm tests/acceptance.rs; echo y > tests/other.rs"], cwd=ws
    )
    assert "Read-only file system" in result.stderr and frozen.read_text() == "fn frozen() {}\n"
    assert (ws / "tests/other.rs").read_text() == "y\n"


def test_secret_masks_come_after_every_bind(ws: Path, target: Path) -> None:
    """A bind of / (readable) or of /etc at another place cannot uncover /etc/shadow: the masks are bound last."""
    shadow = Path("/etc/shadow").read_text()
    over = bwrap_sandbox(ws, target, readable=[Path("/")], binds=[(False, Path("/etc"), Path("/etc"))])
    result = over.run(["cat", "/etc/shadow", "/etc/hostname"], cwd=ws)
    assert result.stdout == Path("/etc/hostname").read_text()  # the binds worked; the secret stayed masked
    assert shadow.splitlines()[0] not in result.stdout + result.stderr


def test_each_secret_is_masked_where_each_bind_puts_it(tmp_path: Path) -> None:
    """The masks follow every bind that shows a secret: of / at /, of /etc at /x, of a link to /etc, of the secret
    itself; a bind whose path merely starts with the same letters (/et, /etc-old) shows none."""
    from flakebot.sandbox.bubblewrap import _secret_masks, secret_files

    secrets = [str(p) for p in secret_files() if p.parent == Path("/etc")]
    if not secrets:
        pytest.skip("no secret file in /etc on this machine")
    (tmp_path / "etc-link").symlink_to("/etc")
    args = ["--ro-bind", "/", "/", "--ro-bind", "/etc", "/x", "--bind", str(tmp_path / "etc-link"), "/y/z"]
    args += ["--ro-bind", secrets[0], "/s", "--ro-bind", "/et", "/a", "--ro-bind", "/etc-old", "/b"]
    masks = _secret_masks(args)
    assert masks[0::3] == ["--ro-bind"] * len(masks[0::3]) and set(masks[1::3]) == {"/dev/null"}
    names = [s.removeprefix("/etc/") for s in secrets]
    under = [f"{top}/{name}" for top in ("/etc", "/x", "/y/z") for name in names]
    assert {p for p in masks[2::3] if not p.startswith(("/etc/ssh/", "/x/ssh/", "/y/z/ssh/"))} == {*under, "/s"}


def test_a_secret_bound_by_a_hard_link_of_it_is_masked_too(tmp_path: Path) -> None:
    """The masks go by what a bind's source is (its device and inode, links followed), not by its path: a hard link
    of a secret (no path of it under /etc) bound into the sandbox shows the secret, and is masked."""
    from flakebot.sandbox.bubblewrap import _secret_masks, secret_files

    secrets = [p for p in secret_files() if p.parent == Path("/etc")]
    if not secrets:
        pytest.skip("no secret file in /etc on this machine")
    linked = tmp_path / "notes"
    try:
        os.link(secrets[0], linked)
    except OSError as exc:
        pytest.skip(f"cannot hard-link {secrets[0]} here: {exc}")
    try:
        masks = _secret_masks(["--ro-bind", str(linked), "/work/notes", "--ro-bind", str(tmp_path), "/data"])
    finally:
        linked.unlink()  # no second name of the secret left in pytest's kept temporary directories
    assert masks == ["--ro-bind", "/dev/null", "/work/notes"]  # the directory holding it is not the secret's


def test_a_workspace_shown_at_another_path_with_binds_over_it(ws: Path, target: Path, tmp_path: Path) -> None:
    """A tool run's shape: the scratch workspace at the caller's path, a named file read-only, a writable one."""
    caller = tmp_path / "caller"
    caller.mkdir()
    (caller / "in.txt").write_text("in\n")
    (caller / "out.txt").write_text("")
    (caller / "other.txt").write_text("other\n")
    binds = [(False, caller / "in.txt", caller / "in.txt"), (True, caller / "out.txt", caller / "out.txt")]
    sandbox = bwrap_sandbox(ws, target, workspace_at=caller, binds=binds, adopt=False)  # as toolrun with --writable
    script = "cat in.txt; cat other.txt; echo x > in.txt; echo written > out.txt; echo new > new.txt; ls"
    result = sandbox.run(["sh", "-c", script + " 2>&1"], cwd=caller)
    assert "in\n" in result.stdout and "other" not in result.stdout.replace("other.txt", "")
    assert (caller / "in.txt").read_text() == "in\n" and (caller / "out.txt").read_text() == "written\n"
    assert not (caller / "new.txt").exists() and (ws / "new.txt").read_text() == "new\n"  # the scratch took it


def _cap_eff(result_stdout: str) -> str:
    return next(line.split()[1] for line in result_stdout.splitlines() if line.startswith("CapEff:"))


@pytest.mark.parametrize("adopt", [True, False])
def test_no_capabilities_and_root_only_files_in_etc_stay_unreadable(ws: Path, target: Path, adopt: bool) -> None:
    """As root too: CapEff is 0, and a mode-600 root file under /etc (a plain one, one on an allowed path) is unreadable."""
    marker, secret = secrets.token_hex(6), secrets.token_hex(12)
    planted = [Path(f"/etc/flakebot-test-{marker}"), Path(f"/etc/ssl/certs/flakebot-test-{marker}")]
    try:
        for path in planted:
            path.write_text(f"root only {secret}\n")
            path.chmod(0o600)
        sandbox = bwrap_sandbox(ws, target, adopt=adopt)
        script = "grep -E '^Cap(Eff|Prm|Amb|Bnd)' /proc/self/status; " + "; ".join(f"cat {p}" for p in planted)
        result = sandbox.run(["bash", "-c", script], cwd=ws)
    finally:
        for path in planted:
            path.unlink(missing_ok=True)
    assert _cap_eff(result.stdout) == "0000000000000000", result.stdout
    if adopt or os.geteuid() != 0:  # without adopt, root keeps its uid (no capabilities): its own files stay its own
        assert secret not in result.stdout + result.stderr
        assert f"/etc/ssl/certs/flakebot-test-{marker}: Permission denied" in result.stderr
    assert f"/etc/flakebot-test-{marker}: No such file or directory" in result.stderr  # not on the allow-list


def test_etc_holds_only_what_toolchains_need(ws: Path, target: Path) -> None:
    result = bwrap_sandbox(ws, target).run(["bash", "-c", "ls /etc; getent passwd root; ls /etc/shadow"], cwd=ws)
    listed = set(result.stdout.split())
    assert {"passwd", "ld.so.cache", "alternatives"} <= listed and "shadow" not in listed and "ssh" not in listed
    assert "root:x:0:0" in result.stdout


def test_the_sandbox_uid_has_a_passwd_entry(ws: Path, target: Path) -> None:
    """A tool that looks up its own user (getpwuid, as `whoami` does) finds one, as in a Nix builder."""
    result = bwrap_sandbox(ws, target).run(["bash", "-c", "whoami; getent group $(id -g); getent passwd root"], cwd=ws)
    assert result.ok, result.stderr
    user = "flakebot" if real_root() else pwd.getpwuid(os.getuid()).pw_name
    assert result.stdout.splitlines()[0] == user and "root:x:0:0" in result.stdout


UID_MAP_AFTER_UNSHARE = """
import ctypes
from flakebot.sandbox import bubblewrap
uid = bubblewrap.SANDBOX_UID_BASE + 123
before = (bubblewrap.real_root(), bubblewrap._uid_mapped(uid))  # the initial namespace's map, now kept
if ctypes.CDLL(None, use_errno=True).unshare(0x10000000) != 0:  # CLONE_NEWUSER
    raise SystemExit(f"unshare: errno {ctypes.get_errno()}")
with open("/proc/self/uid_map", "w") as map_file:
    map_file.write("0 0 1\\n")  # root stays root, and nothing else is mapped
print(before, (bubblewrap.real_root(), bubblewrap._uid_mapped(uid)))
"""


def test_the_uid_map_is_read_again_in_another_user_namespace() -> None:
    """The uid map is kept per user namespace (read once, not at every sandboxed command's start): a process that
    moved to a namespace mapping only root sees the sandbox uid unmapped there, not the map it read before."""
    if not real_root():
        pytest.skip("needs root of the initial user namespace (to make one that maps only root)")
    done = subprocess.run([sys.executable, "-c", UID_MAP_AFTER_UNSHARE], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "(True, True) (True, False)"


def test_a_git_link_in_the_workspace_binds_nothing_over_the_sandbox(ws: Path, target: Path, tmp_path: Path) -> None:
    """A command (a build script, a service) may leave the workspace's .git as a relative link: bound as the
    workspace's .git, bubblewrap would follow it on the host for the source and inside for the destination, so
    .git -> ../../root put the host's real home (credentials) over the sandbox's empty one. Only a real directory
    .git is bound."""
    home = tmp_path / "home"
    home.mkdir(mode=0o755)
    (home / "credentials").write_text("host-only token\n")
    (home / "credentials").chmod(0o644)
    sandbox = dataclasses.replace(bwrap_sandbox(ws, target), home=home)  # its probe ran before the link is made
    (ws / ".git").symlink_to(os.path.relpath(home, ws))
    result = sandbox.run(["sh", "-c", f"cat {home}/credentials; ls -a {home}"], cwd=ws)
    assert "host-only token" not in result.stdout + result.stderr and "credentials" not in result.stdout, result


UID_MAP_BEFORE_IT_IS_WRITTEN = """
import ctypes
from flakebot.sandbox import bubblewrap
if ctypes.CDLL(None, use_errno=True).unshare(0x10000000) != 0:  # CLONE_NEWUSER
    raise SystemExit(f"unshare: errno {ctypes.get_errno()}")
before = bubblewrap._uid_mapped(0)  # the new namespace's map, not written yet: empty
with open("/proc/self/uid_map", "w") as map_file:
    map_file.write("0 0 1\\n")
print(before, (bubblewrap.real_root(), bubblewrap._uid_mapped(0)))
"""


def test_a_uid_map_read_before_it_was_written_is_read_again() -> None:
    """A namespace's map is empty until its parent writes it: the empty answer is not kept for that namespace, or
    root there would stay unmapped (no --unshare-user decision, no sandbox uid) for the process's life."""
    if not real_root():
        pytest.skip("needs root of the initial user namespace (to write a new namespace's map)")
    done = subprocess.run(
        [sys.executable, "-c", UID_MAP_BEFORE_IT_IS_WRITTEN], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False (True, True)"


def test_system_links_are_kept_as_links_whatever_they_point_at(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A system path that is a link (/lib -> usr/lib) is made a link inside, never bound: a bind follows it, so a
    link to a directory, a dangling link or a loop must not be tested through it. System directories are bound
    through links (/nix/store may be one); what is missing or not a directory is left out."""
    from flakebot.sandbox import bubblewrap

    (tmp_path / "dir").mkdir()
    (tmp_path / "file").write_text("x")
    links = {"to-dir": "dir", "to-file": str(tmp_path / "file"), "dangling": "nowhere", "loop": "loop"}
    for name, text in links.items():
        (tmp_path / name).symlink_to(text)
    spelled = {name: str(tmp_path / name) for name in ["dir", "file", "missing", *links]}
    monkeypatch.setattr(bubblewrap, "SYSTEM_LINKS", tuple(spelled.values()))
    monkeypatch.setattr(bubblewrap, "ETC_ALLOWED", ())
    monkeypatch.setattr(bubblewrap, "SYSTEM_DIRS", tuple(spelled[n] for n in ["dir", "to-dir", "dangling", "file"]))
    binds = [("--ro-bind", spelled[n], spelled[n]) for n in ["dir", "to-dir", "dir", "file"]]
    made = [("--symlink", text, spelled[name]) for name, text in links.items()]
    mounts = bubblewrap._system_mounts()
    assert [tuple(mounts[i : i + 3]) for i in range(0, len(mounts), 3)] == [*binds, *made]


def test_every_ssh_host_key_is_a_secret_and_no_public_key_is(tmp_path: Path) -> None:
    """The ssh host keys masked in every sandbox: each private key in /etc/ssh, none of their .pub halves."""
    from flakebot.sandbox.bubblewrap import secret_files

    keys = sorted(p for p in Path("/etc/ssh").glob("ssh_host_*") if p.is_file() and not p.name.endswith(".pub"))
    if not keys:
        pytest.skip("no ssh host key on this machine")
    assert sorted(p for p in secret_files() if p.parent == Path("/etc/ssh")) == keys


def test_a_root_owned_workspace_is_written_and_built_by_the_unprivileged_uid(ws: Path, target: Path) -> None:
    """The edit loop's case: flakebot (root) owns the tree; the sandbox uid writes it and builds into target/."""
    require("cargo")
    subprocess.run(["cargo", "init", "-q", "--offline", "--vcs", "git", "--name", "demo", str(ws)], check=True)
    (ws / "src").chmod(0o755)
    frozen = ws / "tests/frozen.rs"
    frozen.parent.mkdir()
    frozen.write_text("#[test]\nfn kept() {}\n")
    sandbox = bwrap_sandbox(ws, target, frozen=[frozen])
    script = "id -u; echo made > made.txt && echo 'fn main() {}' > src/main.rs && cargo build --offline -q && ls $CARGO_TARGET_DIR/debug/demo; echo x >> tests/frozen.rs || echo frozen-ro"
    result = sandbox.run(["bash", "-c", script], cwd=ws, env={"CARGO_TARGET_DIR": str(target)})
    assert result.ok, result.stderr
    lines = result.stdout.split()
    if os.geteuid() == 0:
        assert lines[0] != "0"
        assert os.stat(ws).st_uid == 0 and os.stat(ws / ".git").st_uid == 0  # host git still trusts the tree
        assert os.stat(frozen).st_mode & 0o777 == 0o644
    assert lines[1:] == [str(target / "debug/demo"), "frozen-ro"]
    assert (ws / "made.txt").read_text() == "made\n"


def test_a_frozen_file_cannot_be_swapped_by_moving_its_directory_aside(ws: Path, target: Path) -> None:
    """The frozen file's read-only bind holds the file, not its name: its directory, handed to the sandbox (adopt),
    could be moved aside and another file put at its path for the rest of the command (a build script swaps the
    acceptance test cargo then compiles, a test puts it back: the guard's hash after the command matches). Each
    directory between the workspace and a frozen file is a mount point in the sandbox: it cannot be renamed."""
    frozen = ws / "tests/acceptance.rs"
    frozen.parent.mkdir()
    frozen.write_text("#[test]\nfn judged() {}\n")
    sandbox = bwrap_sandbox(ws, target, frozen=[frozen])
    swap = "mv tests aside; mkdir tests && echo fake > tests/acceptance.rs; cat tests/acceptance.rs"
    restore = "rm -rf tests; mv aside tests"  # as the fake test would, once compiled and run
    result = sandbox.run(["sh", "-c", f"{swap}; {restore}"], cwd=ws)
    assert frozen.read_text() == "#[test]\nfn judged() {}\n"  # what the guard's hash sees after the command
    assert "fake" not in result.stdout, "the frozen path held another file during the command"


def test_a_bind_of_etc_elsewhere_keeps_its_secrets_masked(ws: Path, target: Path) -> None:
    """/etc bound at another path shows /etc/shadow there too: the mask follows the bind, not the original path."""
    shadow = Path("/etc/shadow").read_text()
    elsewhere = ws.parent / "etc-copy"
    sandbox = bwrap_sandbox(ws, target, binds=[(False, Path("/etc"), elsewhere)], adopt=False)
    result = sandbox.run(["cat", str(elsewhere / "shadow"), str(elsewhere / "hostname")], cwd=ws)
    assert result.stdout == Path("/etc/hostname").read_text()
    assert shadow.splitlines()[0] not in result.stdout + result.stderr


def test_a_file_bound_below_an_empty_directory_mount_gets_traversable_parents(tmp_path: Path) -> None:
    """A tool run mounts an empty scratch directory at the caller's path and binds the file it names below it: the
    file's parent directories do not exist in the scratch directory, so they are made 0755 (bubblewrap alone makes
    them 0700, and the unprivileged uid cannot read the file). Directories the mounted source holds are left alone."""
    from flakebot.sandbox.bubblewrap import _parents_first

    scratch, caller = tmp_path / "scratch", tmp_path / "caller"
    (scratch / "kept").mkdir(parents=True)
    (caller / "demo").mkdir(parents=True)
    (caller / "demo" / "people.csv").write_text("id\n")
    args = ["--bind", str(scratch), "/work/p", "--ro-bind", str(caller / "demo/people.csv"), "/work/p/demo/people.csv"]
    args += ["--ro-bind", str(caller / "demo/people.csv"), "/work/p/kept/people.csv"]
    out = _parents_first(args)
    made = [out[i + 1] for i, op in enumerate(out) if op == "--dir"]
    assert "/work/p/demo" in made and "/work/p/kept" not in made and "/work" in made
    demo = out.index("/work/p/demo")
    assert out[demo - 3 : demo] == ["--perms", "0755", "--dir"] and demo < out.index("/work/p/demo/people.csv")


def test_a_path_spelled_with_a_leading_double_slash_is_not_taken_for_one_under_a_bind_of_the_root(
    tmp_path: Path,
) -> None:
    """pathlib keeps '//' as an anchor of its own: '//tmp' is not below '/', so an empty directory mounted at / does
    not hold //tmp (it must be made 0755, as pathlib's parents had it) whatever the host's /tmp is."""
    from flakebot.sandbox.bubblewrap import _below, _parents_first

    scratch = tmp_path / "scratch"
    scratch.mkdir()
    out = _parents_first(["--bind", str(scratch), "/", "--ro-bind", "/etc/hostname", "//tmp/p/hostname"])
    made = [out[i + 1] for i, op in enumerate(out) if op == "--dir"]
    assert made == ["//", "//tmp", "//tmp/p"]
    assert _below("//tmp", "/") is None and _below("/tmp", "//") is None and _below("//tmp/p", "//tmp") == "p"


def test_a_line_read_as_it_comes_is_bounded_however_long_the_command_writes_without_a_newline(tmp_path: Path) -> None:
    """cargo test's stdout is read line by line while the tests run (the verdict's early examples); a test writing
    megabytes without a newline must not grow flakebot's memory with them: the piece past LINE_CAP is dropped, and
    the lines after it still arrive whole."""
    from flakebot.sandbox.process import LINE_CAP, execute

    script = f"head -c {3 * LINE_CAP} /dev/zero | tr '\\0' x; printf '\\nafter\\n'"
    seen: list[str] = []
    result = execute(["sh"], ["sh", "-c", script], cwd=tmp_path, env={"PATH": "/usr/bin:/bin"}, timeout=30,
                     stdin=None, output_cap=1024, on_line=seen.append)  # fmt: skip
    assert result.returncode == 0
    assert seen[-1] == "after" and max(len(line) for line in seen) <= LINE_CAP
