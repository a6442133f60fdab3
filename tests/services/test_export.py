"""One flake, every way to run it: tests/fixtures/kv-service packaged (`package-service --offline`, the host
stand-in) and its flake's service outputs evaluated by real nix; then exported through the real CLI as an OCI
layout (unpacked by umoci, its entrypoint run under bubblewrap with its own network namespace) and as a deploy-rs
node (evaluated against the real flake's module, its unit verified by systemd-analyze)."""

from __future__ import annotations

import http.client
import json
import os
import resource
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from flakebot.nix import command, service_outputs
from flakebot.services import nixos, oci
from flakebot.services.exportfiles import ExportDir
from tests.conftest import REPO, json_result, require, run_cli

KV_SERVICE = REPO / "tests" / "fixtures" / "kv-service"
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def packaged(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, str], dict[str, Any]]:
    """A home whose catalog holds kv-service, and its manifest."""
    require("nix", "cargo", "bwrap", "pasta", "systemd-analyze")
    home = tmp_path_factory.mktemp("exporthome")
    env = {f"XDG_{d.upper()}_HOME": str(home / d) for d in ("data", "cache", "state", "config")}
    env["FLAKEBOT_WORKDIR"] = str(home / "work")
    done = run_cli("package-service", str(KV_SERVICE), "--offline", "--stop-grace", "2", "--json", env=env)
    assert done.returncode == 0, done.stderr
    manifest = json.loads(
        next((home / "data" / "flakebot" / "tools" / "kv-service").glob("*/manifest.json")).read_text()
    )
    return env, manifest


def _nix_eval(manifest: dict[str, Any], attribute: str, *extra: str) -> Any:
    flake, mode, standin = command.run_target(manifest["nix_run_argv"])
    argv = command.nix_argv(["eval"], ["--json", f"{flake}#{attribute}", *extra], mode, standin)
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_the_service_flake_carries_its_declaration_module_and_image(
    packaged: tuple[dict[str, str], dict[str, Any]],
) -> None:
    _, manifest = packaged
    declaration = _nix_eval(manifest, "lib.flakebot.service")
    assert declaration == {"name": "kv-service", "kind": "service", **manifest["service"]}
    flake, mode, standin = command.run_target(manifest["nix_run_argv"])
    # nixosModules.default: the module export --nixos writes, its package the flake's own (lib.mkDefault)
    service = nixos.evaluate_flake(flake, mode, standin, "kv-service", 9191)
    unit = nixos.unit_file(service)
    lines = unit.splitlines()
    assert f"ExecStart={manifest['store_path']}/bin/kv-service" in lines
    for line in ('Environment="PORT=9191"', "DynamicUser=true", "StateDirectory=flakebot-kv-service",
                 "Restart=on-failure", "TimeoutStopSec=2", "ProtectSystem=strict", f"LoadCredential={nixos.CHECK_CREDENTIAL}"):  # fmt: skip
        assert line in lines, line
    problems, exposure = nixos.verify(unit, "kv-service")
    assert problems == [] and " OK " in exposure
    # packages.ociImage is the stand-in's buildLayeredImage of the package, named and tagged for the service
    image = _nix_eval(manifest, f"packages.{command.nix_system()}.ociImage", "--apply",
                      "i: { inherit (i) imageName imageTag; drv = i.drvPath; }")  # fmt: skip
    assert image["imageName"] == "flakebot-kv-service" and image["imageTag"] == manifest["version"]
    outputs = _nix_eval(manifest, "packages", "--apply", "builtins.mapAttrs (system: builtins.attrNames)")
    assert "ociImage" in outputs["x86_64-linux"] and "ociImage" not in outputs["aarch64-darwin"]  # images are Linux
    flake_text = (Path(flake) / "flake.nix").read_text()
    assert "pkgs.dockerTools.buildLayeredImage" in flake_text
    expected = service_outputs.image_text("kv-service", manifest["version"], "kv-service", manifest["service"])
    assert all(line.strip() in flake_text for line in expected.splitlines() if line.strip())


def test_the_flake_image_is_the_exported_image_and_the_stand_in_refuses_what_it_lacks(
    packaged: tuple[dict[str, str], dict[str, Any]], tmp_path: Path
) -> None:
    env, manifest = packaged
    flake, mode, standin = command.run_target(manifest["nix_run_argv"])
    argv = command.nix_argv(["build"], ["--json", "--no-link", f"{flake}#ociImage"], mode, standin)
    built = subprocess.run(argv, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
    assert built.returncode == 0, built.stderr
    from_flake = oci.read_archive(Path(json.loads(built.stdout)[0]["outputs"]["out"]))
    exported = json_result(run_cli("export", "kv-service", "--oci", "-o", str(tmp_path), "--json", env=env))
    from_catalog = oci.read_archive(Path(exported["image"]))
    assert (from_flake.config, from_flake.layers) == (from_catalog.config, from_catalog.layers)
    oci.check_config(from_flake, manifest)
    # an argument of nixpkgs' buildLayeredImage the stand-in does not implement fails evaluation, saying so
    expr = f'(builtins.getFlake "path:{standin}").legacyPackages.{command.nix_system()}.dockerTools.buildLayeredImage'
    argv = command.nix_argv(["eval"], ["--impure", "--expr", f'({expr} {{ name = "x"; fromImage = null; }}).drvPath'],
                            mode, standin)  # fmt: skip
    refused = subprocess.run(argv, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert (
        refused.returncode != 0
        and "fromImage is valid for nixpkgs' buildLayeredImage but not implemented" in refused.stderr
    )


def test_the_oci_export_unpacks_with_umoci_and_answers_under_bubblewrap(
    packaged: tuple[dict[str, str], dict[str, Any]], tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    require("umoci", "setpriv", "nsenter", "curl")
    env, manifest = packaged
    exported = json_result(run_cli("export", "kv-service", "--oci", "-o", str(tmp_path / "out"), "--json", env=env))
    layout = Path(exported["layout"])
    assert layout == tmp_path / "out" / "flakebot-kv-service.oci"
    # the bundle where the image's user can reach it (pytest's tmp_path sits in a 0700 directory)
    bundle = Path(tempfile.mkdtemp(prefix="flakebot-oci-")) / "bundle"
    request.addfinalizer(lambda: shutil.rmtree(bundle.parent))
    unpacked = subprocess.run(["umoci", "unpack", "--image", f"{layout}:{manifest['version']}", str(bundle)],
                              capture_output=True, text=True, timeout=120)  # fmt: skip
    assert unpacked.returncode == 0, unpacked.stderr
    process = json.loads((bundle / "config.json").read_text())["process"]
    assert process["user"]["uid"] == 65534 and process["args"] == [f"{manifest['store_path']}/bin/kv-service"]
    rootfs = bundle / "rootfs"
    assert (rootfs / "tmp").stat().st_mode & 0o1777 == 0o1777
    state = rootfs / "var" / "lib" / "flakebot-kv-service"
    assert state.stat().st_uid == 65534
    bundle.parent.chmod(0o755)
    bundle.chmod(0o755)  # umoci makes it 0700; the service's user must reach its rootfs
    # the rootfs's own directories on an empty root and nothing of the host's: the image carries the loader and the
    # libraries its binary links (the host stand-in's build links this machine's)
    assert (rootfs / "lib64" / "ld-linux-x86-64.so.2").is_file() and not (rootfs / "usr").exists()
    assert not (rootfs / "lib64" / "ld-linux-x86-64.so.2").is_symlink()
    binds = [arg for entry in sorted(rootfs.iterdir()) for arg in ("--bind", str(entry), f"/{entry.name}")]
    env_args = [arg for item in process["env"] for arg in ("--setenv", *item.split("=", 1))]
    user = [f"--reuid={process['user']['uid']}", f"--regid={process['user']['gid']}", "--clear-groups"]
    info = tmp_path / "info.json"
    with info.open("w") as info_file:
        sandbox = subprocess.Popen(
            ["setpriv", *user, "bwrap", *binds, "--proc", "/proc", "--dev", "/dev", "--unshare-net", "--unshare-pid",
             "--die-with-parent", "--clearenv", *env_args, "--chdir", process["cwd"],
             "--info-fd", str(info_file.fileno()), "--", *process["args"]],
            pass_fds=(info_file.fileno(),), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
    try:
        pid = _child_pid(info)

        def curl(*args: str) -> str:
            done = subprocess.run(["nsenter", f"--net=/proc/{pid}/ns/net", "curl", "-s", "-m", "2", *args],
                                  capture_output=True, text=True, timeout=10)  # fmt: skip
            return done.stdout

        assert _eventually(lambda: curl("-w", " %{http_code}", "http://127.0.0.1:8080/health").endswith(" 200"))
        assert curl("-X", "PUT", "--data-binary", "kept", "http://127.0.0.1:8080/kv/k") == "stored\n"
        assert curl("http://127.0.0.1:8080/kv/k") == "kept"
        assert (state / "kv").is_dir()  # written by the image's user into its own state directory
    finally:
        sandbox.kill()
        sandbox.wait(timeout=10)
    text = run_cli("export", "kv-service", "--oci", "-o", str(tmp_path / "out"), env=env)
    assert text.returncode == 2 and "exists" in text.stderr and len(text.stderr.strip().splitlines()) == 1


@pytest.fixture
def podman(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A `podman` of its own: runc (crun cannot run where cgroups are in hybrid mode), cgroupfs, slirp4netns,
    vfs storage and its run and temporary directories all in a fresh directory; removed after."""
    require("podman", "runc", "slirp4netns")
    home = Path(tempfile.mkdtemp(prefix="flakebot-podman-"))
    (home / "containers.conf").write_text(
        '[containers]\nnetns = "slirp4netns"\n'
        # no more than the machine's own limits: without CAP_SYS_RESOURCE (a container) runc cannot raise them
        f'default_ulimits = ["nofile={min(resource.getrlimit(resource.RLIMIT_NOFILE)[1], 4096)}", '
        f'"nproc={min(resource.getrlimit(resource.RLIMIT_NPROC)[1], 4096)}"]\n'
        f'[engine]\nruntime = "runc"\ncgroup_manager = "cgroupfs"\nevents_logger = "file"\n'
        f'tmp_dir = "{home}/tmp"\nvolume_path = "{home}/volumes"\n'
    )
    (home / "storage.conf").write_text(
        f'[storage]\ndriver = "vfs"\ngraphroot = "{home}/root"\nrunroot = "{home}/run"\n'
    )
    env = {**os.environ, "CONTAINERS_CONF": str(home / "containers.conf"),
           "CONTAINERS_STORAGE_CONF": str(home / "storage.conf")}  # fmt: skip

    def run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout, env=env,
                              stdin=subprocess.DEVNULL)  # fmt: skip

    yield run
    run("rm", "--all", "--force", "--time", "0")
    run("rmi", "--all", "--force")
    shutil.rmtree(home, ignore_errors=True)


def test_the_oci_export_runs_under_podman_and_answers_through_its_published_port(
    packaged: tuple[dict[str, str], dict[str, Any]], tmp_path: Path, podman: Any
) -> None:
    """The layout export wrote, loaded by a real container engine and run with `-p`: a request from the host
    through the published port reaches the service (it listens on all addresses of its own network namespace)."""
    env, manifest = packaged
    exported = json_result(run_cli("export", "kv-service", "--oci", "-o", str(tmp_path), "--json", env=env))
    assert exported["network"] is False
    loaded = podman("load", "--input", exported["layout"])
    assert loaded.returncode == 0, loaded.stderr
    image = loaded.stdout.strip().rpartition("Loaded image: ")[2].strip() or loaded.stdout
    labels = json.loads(podman("image", "inspect", image).stdout)[0]["Labels"]
    assert labels == {"io.flakebot.network": "none"}
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        host_port = probe.getsockname()[1]
    name = f"flakebot-test-{os.getpid()}"
    started = podman("run", "--detach", "--name", name, "--publish", f"127.0.0.1:{host_port}:8080", image)
    assert started.returncode == 0, started.stderr
    try:
        base = f"http://127.0.0.1:{host_port}"
        assert _eventually(lambda: _http("GET", f"{base}/health")[0] == 200), podman("logs", name).stderr
        assert _http("PUT", f"{base}/kv/k", b"kept") == (200, b"stored\n")
        assert _http("GET", f"{base}/kv/k") == (200, b"kept")
        inside = json.loads(podman("inspect", name).stdout)[0]
        assert inside["Config"]["User"] == "65534:65534" and inside["State"]["Running"]
    finally:
        removed = podman("rm", "--force", "--time", "2", name)
    assert removed.returncode == 0, removed.stderr
    assert podman("ps", "--all", "--quiet", "--filter", f"name={name}").stdout.strip() == ""


def test_the_nixos_modules_unit_runs_under_systemd_as_pid_1_with_its_address_port_and_credential(
    packaged: tuple[dict[str, str], dict[str, Any]], tmp_path: Path, podman: Any
) -> None:
    """The unit the exported module makes (listenAddress, port and credentialFiles set as a configuration sets
    them), run by a real systemd as PID 1 in a podman container (the host's /usr and /nix/store read-only beside a
    tiny /etc): its dynamic user, environment and credential, and a request through the published port."""
    env, manifest = packaged
    exported = json_result(run_cli("export", "kv-service", "--nixos", "-o", str(tmp_path), "--json", env=env))
    options = {"listenAddress": "0.0.0.0", "credentialFiles": {"token": "/etc/flakebot-keys/token"},
               # podman's port forward (slirp4netns) comes from its gateway, not localhost: let it in where
               # systemd's IP filter applies (cgroup v2)
               "allowedAddresses": ["any"]}  # fmt: skip
    service = nixos.evaluate(Path(exported["module"]), "kv-service", manifest["store_path"], 9191,
                             manifest["main_program"], options=options)  # fmt: skip
    unit = nixos.unit_file(service)
    assert nixos.verify(unit, "kv-service")[0] == []
    root = Path(tempfile.mkdtemp(prefix="flakebot-systemd-"))
    try:
        _systemd_root(root, unit)
        name = f"flakebot-systemd-{os.getpid()}"
        base = _boot_systemd(podman, root, name)
        assert _http("PUT", f"{base}/kv/k", b"kept") == (200, b"stored\n")

        def inside(*argv: str, user: str = "0") -> subprocess.CompletedProcess[str]:
            return podman("exec", "--user", user, name, *argv)

        shown = inside("systemctl", "show", "flakebot-kv-service", "-p", "MainPID", "-p", "ActiveState").stdout
        state = dict(line.split("=", 1) for line in shown.splitlines() if "=" in line)
        assert state["ActiveState"] == "active", shown
        pid = state["MainPID"]
        environ = dict(item.split("=", 1) for item in inside("cat", f"/proc/{pid}/environ").stdout.split("\0") if item)
        assert environ["LISTEN_ADDRESS"] == "0.0.0.0" and environ["PORT"] == "9191"
        credentials = environ["CREDENTIALS_DIRECTORY"]
        uid = next(line.split()[1] for line in inside("cat", f"/proc/{pid}/status").stdout.splitlines()
                   if line.startswith("Uid:"))  # fmt: skip
        assert uid not in ("0", "65534")  # DynamicUser: a uid of its own
        assert inside("cat", f"{credentials}/token", user=uid).stdout == "s3cret\n"  # the service's user reads it
        assert inside("cat", f"{credentials}/token", user="65534").returncode != 0  # nobody else does
        assert (root / "var" / "lib" / "private" / "flakebot-kv-service" / "kv" / "k").read_bytes() == b"kept"
        removed = podman("rm", "--force", "--time", "5", name)
        assert removed.returncode == 0, removed.stderr
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_a_handoff_services_socket_unit_holds_the_port_across_a_kill_under_systemd_as_pid_1(
    packaged: tuple[dict[str, str], dict[str, Any]], tmp_path: Path, podman: Any
) -> None:
    """kv-service declared `socket: handoff` (it accepts on fd 3 when LISTEN_FDS is set), its exported module's
    socket and service units run by a real systemd as PID 1: the service gets the socket systemd listens on, and a
    client looping requests while the service is killed with SIGKILL is never refused (systemd keeps the socket
    and starts the service again; requests wait in its backlog)."""
    _, manifest = packaged
    handoff = {**manifest, "service": {**manifest["service"], "socket": "handoff"}}
    exported = nixos.export_nixos(handoff, ExportDir(tmp_path / "export"))
    assert exported["problems"] == [], exported["problems"]
    options = {"listenAddress": "0.0.0.0", "allowedAddresses": ["any"],  # podman's forward: see the test above
               "credentialFiles": {"token": "/etc/flakebot-keys/token"}}  # fmt: skip
    module = Path(exported["module"])
    evaluated = {kind: nixos.evaluate(module, "kv-service", manifest["store_path"], 9191, manifest["main_program"],
                                      options=options, attribute=f'systemd.{kind}."flakebot-kv-service"')
                 for kind in ("services", "sockets")}  # fmt: skip
    root = Path(tempfile.mkdtemp(prefix="flakebot-systemd-"))
    try:
        _systemd_root(root, nixos.unit_file(evaluated["services"]), socket=nixos.socket_file(evaluated["sockets"]))
        name = f"flakebot-systemd-socket-{os.getpid()}"
        base = _boot_systemd(podman, root, name)

        def main_pid() -> str:
            shown = podman("exec", name, "systemctl", "show", "flakebot-kv-service", "-p", "MainPID").stdout
            return shown.strip().partition("=")[2]

        pid = main_pid()
        environ = dict(item.split("=", 1) for item in podman("exec", name, "cat", f"/proc/{pid}/environ").stdout
                       .split("\0") if item)  # fmt: skip
        assert environ["LISTEN_FDS"] == "1" and environ["LISTEN_PID"] == pid
        answers: list[int] = []
        stop = threading.Event()

        def loop() -> None:
            while not stop.is_set():
                try:
                    with urllib.request.urlopen(f"{base}/health", timeout=10) as answer:
                        answers.append(answer.status)
                except urllib.error.URLError as exc:  # refused: the port had no listener
                    refused = isinstance(exc.reason, ConnectionRefusedError)
                    answers.append(0 if refused else -1)
                except (OSError, http.client.HTTPException):  # the request the killed process held: reset
                    answers.append(-1)

        client = threading.Thread(target=loop)
        client.start()
        try:
            time.sleep(0.3)
            killed = podman("exec", name, "kill", "-KILL", pid)
            assert killed.returncode == 0, killed.stderr
            assert _eventually(lambda: main_pid() not in ("", "0", pid)), "systemd did not start it again"
            time.sleep(0.5)
        finally:
            stop.set()
            client.join(30)
        # none refused; at most the one request the killed process had accepted is lost (a reset, not a refusal)
        assert 0 not in answers and answers.count(-1) <= 1 and answers.count(200) > 10, answers
        podman("rm", "--force", "--time", "5", name)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _boot_systemd(podman: Any, root: Path, name: str) -> str:
    """systemd as PID 1 of container `name` on `root` (the host's /usr and /nix/store read-only), its port 9191
    published on a free port of the host's loopback: the service's base URL once it answers /health."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        host_port = probe.getsockname()[1]
    started = podman("run", "--detach", "--name", name, "--systemd=always", "--volume", "/usr:/usr:ro",
                     "--volume", "/nix/store:/nix/store:ro", "--publish", f"127.0.0.1:{host_port}:9191",
                     "--rootfs", str(root), "/lib/systemd/systemd", "--unit=flakebot-check.target")  # fmt: skip
    assert started.returncode == 0, started.stderr
    base = f"http://127.0.0.1:{host_port}"
    healthy = _eventually(lambda: _http("GET", f"{base}/health")[0] == 200)
    assert healthy, podman("exec", name, "journalctl", "--no-pager", "-n", "20").stdout
    return base


def _systemd_root(root: Path, unit: str, socket: str = "") -> None:
    """A root for systemd as PID 1: /usr and /nix/store come from the host (bound read-only), /etc holds the unit,
    a target that wants it, the credential file and the few files systemd reads."""
    root.chmod(0o755)  # mkdtemp's 0700 would keep the service's dynamic user out of /
    for directory in ("usr", "nix/store", "etc/systemd/system", "etc/flakebot-keys", "var", "run", "tmp", "root"):
        (root / directory).mkdir(parents=True)
    for link in ("bin", "sbin", "lib", "lib64"):
        (root / link).symlink_to(f"usr/{link}")
    etc = root / "etc"
    (etc / "passwd").write_text("root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/usr/sbin/nologin\n")
    (etc / "group").write_text("root:x:0:\nnogroup:x:65534:\n")
    (etc / "nsswitch.conf").write_text("passwd: files systemd\ngroup: files systemd\n")
    (etc / "machine-id").write_text("")
    (etc / "os-release").symlink_to("../usr/lib/os-release")
    (etc / "flakebot-keys" / "token").write_text("s3cret\n")
    (etc / "flakebot-keys" / "token").chmod(0o600)
    (etc / "systemd" / "system" / "flakebot-kv-service.service").write_text(unit)
    wants = "flakebot-kv-service.service"
    if socket:
        (etc / "systemd" / "system" / "flakebot-kv-service.socket").write_text(socket)
        wants = f"flakebot-kv-service.socket {wants}"
    (etc / "systemd" / "system" / "flakebot-check.target").write_text(
        f"[Unit]\nDescription=flakebot check\nWants={wants}\n"
    )


def _http(method: str, url: str, data: bytes | None = None, timeout: float = 2) -> tuple[int, bytes]:
    """One request from the host (status 0 when nothing answers)."""
    try:
        request = urllib.request.Request(url, data=data, method=method)
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()
    except OSError:
        return 0, b""


def test_export_carries_outbound_network_from_the_flag_and_from_the_services_own_run(
    packaged: tuple[dict[str, str], dict[str, Any]], tmp_path: Path
) -> None:
    """Closed unless asked: `--network`, or the service last ran here with `up --network` (its launch record)."""
    env, _ = packaged

    def exported(out: str, *extra: str) -> tuple[bool, str]:
        done = run_cli("export", "kv-service", "--nixos", "--no-check", "-o", str(tmp_path / out), *extra, "--json",
                       env=env)  # fmt: skip
        result = json_result(done)
        return result["network"], (tmp_path / out / "flakebot-kv-service.nix").read_text()

    network, text = exported("closed")
    assert network is False and "default = false;" in text
    network, text = exported("asked", "--network")
    assert network is True and "default = true;  # exported with --network" in text
    node = json_result(run_cli("export", "kv-service", "--deploy-rs", "--network", "-o", str(tmp_path / "node"),
                               "--json", env=env))  # fmt: skip
    assert node["problems"] == [] and node["network"] is True
    assert not {"IPAddressDeny=any", "IPAddressAllow=localhost"} & set(node["unit"].splitlines())
    up = run_cli("up", "kv-service", "--network", "--json", env=env)
    try:
        assert json_result(up)["network"] is True
        network, text = exported("from-launch")
        assert network is True and "default = true;" in text
    finally:
        assert run_cli("down", "kv-service", env=env).returncode == 0
    # the record is the last run's: a run without --network closes the export again (and leaves the other tests
    # of this module a service that last ran closed)
    assert run_cli("up", "kv-service", env=env).returncode == 0
    assert run_cli("down", "kv-service", env=env).returncode == 0
    assert exported("closed-again")[0] is False


def test_the_oci_export_builds_from_the_catalog_entry_not_from_the_flake_tree(
    packaged: tuple[dict[str, str], dict[str, Any]], tmp_path: Path
) -> None:
    """A flake tree changed after cataloguing (a root user, a shell entrypoint) is not what export builds."""
    env, manifest = packaged
    flake, _, _ = command.run_target(manifest["nix_run_argv"])
    flake_nix = Path(flake) / "flake.nix"
    original = flake_nix.read_text()
    hostile = original.replace('User = "65534:65534";', 'User = "0:0";').replace(
        'Entrypoint = [ "${package}/bin/kv-service" ];', 'Entrypoint = [ "/bin/sh" ];'
    )
    assert hostile != original
    flake_nix.write_text(hostile)
    try:
        done = run_cli("export", "kv-service", "--oci", "-o", str(tmp_path), "--json", env=env)
    finally:
        flake_nix.write_text(original)
    exported = json_result(done)
    assert exported["user"] == "65534:65534"
    assert exported["entrypoint"] == [f"{manifest['store_path']}/bin/kv-service"]


def test_the_deploy_rs_export_evaluates_against_the_real_module_and_its_unit_verifies(
    packaged: tuple[dict[str, str], dict[str, Any]], tmp_path: Path
) -> None:
    env, manifest = packaged
    out = tmp_path / "deploy"
    done = run_cli(
        "export", "kv-service", "--deploy-rs", "--host", "web1.example.org", "-o", str(out), "--json", env=env
    )
    result = json_result(done)
    assert result["problems"] == [] and result["node"] == "web1-example-org"
    assert result["settings"] == {"hostname": "web1.example.org", "magicRollback": True, "autoRollback": True,
                                  "confirmTimeout": 30}  # fmt: skip
    assert f"ExecStart={manifest['store_path']}/bin/kv-service" in result["unit"].splitlines()
    text = (out / "flakebot-kv-service-deploy.nix").read_text()
    assert "deploy-rs.lib.${system}.activate.nixos self.nixosConfigurations.web1-example-org" in text
    assert (out / "flakebot-kv-service.nix").read_text() == nixos.module_text(manifest)
    again = run_cli("export", "kv-service", "--deploy-rs", "--host", "web1.example.org", "-o", str(out), env=env)
    assert again.returncode == 2 and again.stderr.startswith("error: ") and "--force" in again.stderr
    # a module that breaks the node's unit fails the check (exit 50): the check reads what was written
    broken = text.replace("{ services.flakebot-kv-service.enable = true; }",
                          '{ services.flakebot-kv-service.enable = true; '
                          'systemd.services.flakebot-kv-service.serviceConfig.KillSignal = "SIGNOPE"; }')  # fmt: skip
    from flakebot.config import load
    from flakebot.services import deployrs

    (out / "flakebot-kv-service-deploy.nix").write_text(broken)
    os.environ.update(env)
    try:
        node = deployrs.evaluate(out / "flakebot-kv-service-deploy.nix", manifest, "web1.example.org", load())
    finally:
        for key in env:
            os.environ.pop(key, None)
    problems, _ = deployrs.check_node(node, manifest, "web1.example.org")
    assert any("SIGNOPE" in p for p in problems), problems


def _child_pid(info: Path) -> int:
    def read() -> int | None:
        try:
            return int(json.loads(info.read_text())["child-pid"])
        except (ValueError, KeyError):
            return None

    pid = _eventually(read)
    assert pid
    return int(pid)


def _eventually(probe: Any, timeout: float = 20) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(0.1)
    return probe()


def _refused(done: subprocess.CompletedProcess[str], words: str, code: int = 2) -> None:
    """One `error: ... Fix: ...` line, exit `code` (2: the arguments; 5: this machine), no traceback."""
    assert done.returncode == code, done.stderr
    assert "Traceback" not in done.stderr
    error = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(error) == 1 and words in error[0] and "Fix:" in done.stderr, done.stderr


@pytest.mark.parametrize("target", ["--oci", "--nixos", "--deploy-rs"])
def test_an_out_directory_that_cannot_be_written_is_refused_before_any_build_and_nothing_is_left(
    packaged: tuple[dict[str, str], dict[str, Any]], read_only_dir: Path, target: str
) -> None:
    env, _ = packaged
    for out in ("/proc/nope", "/proc/nope/deeper", str(read_only_dir), str(read_only_dir / "new" / "sub")):
        done = run_cli("export", "kv-service", target, "--out", out, env=env, timeout=120)
        _refused(done, f"cannot write into {out}", code=5)  # the machine's trouble: HostError
        assert not Path(out).exists() or Path(out) == read_only_dir
    assert list(read_only_dir.iterdir()) == []


def test_a_bad_deploy_rs_host_leaves_no_output_directory(
    packaged: tuple[dict[str, str], dict[str, Any]], tmp_path: Path
) -> None:
    env, _ = packaged
    out = tmp_path / "made" / "here"
    done = run_cli("export", "kv-service", "--deploy-rs", "--host", "bad host", "--out", str(out), env=env)
    _refused(done, "'bad host' is not a host name")
    assert not (tmp_path / "made").exists()


def test_a_failed_export_removes_the_directories_it_made_and_only_those(
    packaged: tuple[dict[str, str], dict[str, Any]], tmp_path: Path
) -> None:
    env, _ = packaged
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "flakebot-kv-service.nix").mkdir()  # a directory where the module goes: the write is refused
    done = run_cli("export", "kv-service", "--nixos", "--out", str(kept), "--force", env=env, timeout=120)
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert kept.is_dir()  # the user's own directory stays
    fresh = tmp_path / "fresh" / "out"
    done = run_cli("export", "kv-ghost", "--nixos", "--out", str(fresh), env=env)
    assert done.returncode != 0 and not (tmp_path / "fresh").exists()
