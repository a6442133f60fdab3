"""The host-toolchain stand-in for nixpkgs, evaluated by real nix: what it provides and what it refuses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flakebot.nix import build_inputs, licenses
from flakebot.nix.standin import ensure_standin, package_links, pc_requires
from tests.conftest import DEBIAN_REGISTRY, require
from tests.fakes.nix_crates import greeter, host_settings, json_of, standin_eval


@pytest.fixture
def standin(tmp_path: Path) -> Path:
    require("nix")
    return ensure_standin(host_settings(tmp_path))


def _call(crate: Path, attrs: str) -> str:
    """A buildRustPackage call on `crate` with the usual arguments plus `attrs`."""
    return f'pkgs.rustPlatform.buildRustPackage {{ pname = "greeter"; version = "0.3.1"; src = {crate}; cargoLock.lockFile = {crate}/Cargo.toml; {attrs} }}'


def test_rendered_for_this_machine_and_stable(standin: Path, tmp_path: Path) -> None:
    host = json.loads((standin / "host.json").read_text())
    # builds see the toolchain and the registry under /flakebot, bound from where they are on the host
    mounts = host["sandboxPaths"]
    assert host["registry"] == "/flakebot/registry" and mounts["/flakebot/registry"] == str(DEBIAN_REGISTRY)
    inside = next(prefix for prefix in mounts if host["toolchainBin"].startswith(prefix + "/"))
    assert Path(mounts[inside], Path(host["toolchainBin"]).relative_to(inside), "cargo").exists()
    assert Path(host["hostToolchainBin"], "cargo").exists() and "cargo" in host["hostToolchainTools"]
    assert Path(host["bash"]).is_absolute() and "/usr/bin" in host["path"].split(":")
    assert host["path"].split(":")[0] == host["toolchainBin"] and host["rustupHome"] in ("/flakebot/rustup", "")
    before = {p.name: p.stat().st_mtime_ns for p in standin.iterdir()}
    assert ensure_standin(host_settings(tmp_path)) == standin
    assert {p.name: p.stat().st_mtime_ns for p in standin.iterdir()} == before  # unchanged files keep the store hash


def test_refuses_an_attribute_buildrustpackage_does_not_accept(standin: Path, tmp_path: Path) -> None:
    crate = greeter(tmp_path / "greeter")
    call = _call(crate, 'cargoSha = "sha256-x";')
    result = standin_eval(standin, f"({call}).drvPath")
    assert result.returncode != 0
    assert "does not accept cargoSha (not an argument of nixpkgs' buildRustPackage)" in result.stderr


def test_refuses_a_misspelt_cargolock_field(standin: Path, tmp_path: Path) -> None:
    crate = greeter(tmp_path / "greeter")
    expression = f'(pkgs.rustPlatform.buildRustPackage {{ pname = "g"; version = "1"; src = {crate}; cargoLock.lockfile = {crate}/Cargo.toml; }}).drvPath'
    result = standin_eval(standin, expression)
    assert result.returncode != 0 and "cargoLock does not accept lockfile" in result.stderr


def test_real_but_unimplemented_attributes_point_to_pinned_nixpkgs(standin: Path, tmp_path: Path) -> None:
    crate = greeter(tmp_path / "greeter")
    call = _call(crate, "useNextest = true;")
    result = standin_eval(standin, f"({call}).drvPath")
    assert (
        result.returncode != 0
        and "useNextest is valid for nixpkgs' buildRustPackage but not implemented" in result.stderr
    )
    no_lock = f'(pkgs.rustPlatform.buildRustPackage {{ pname = "g"; version = "1"; src = {crate}; }}).drvPath'
    assert "needs cargoLock" in standin_eval(standin, no_lock).stderr


def test_accepts_what_generated_flakes_pass(standin: Path, tmp_path: Path) -> None:
    crate = greeter(tmp_path / "greeter")
    attrs = (
        'cargoBuildFlags = [ "-p" "greeter" "--bin" "greeter" ]; cargoTestFlags = [ "-p" "greeter" ]; '
        "nativeBuildInputs = with pkgs; [ pkg-config rustPlatform.bindgenHook ]; buildInputs = with pkgs; [ openssl sqlite ]; "
        'env = { RUSTONIG_SYSTEM_LIBONIG = "true"; }; doCheck = false; '
        'meta = { description = "d"; license = with lib.licenses; [ mit asl20 ]; mainProgram = "greeter"; };'
    )
    value = json_of(standin_eval(standin, f"let p = {_call(crate, attrs)}; in {{ inherit (p) name meta drvPath; }}"))
    assert isinstance(value, dict)
    assert value["name"] == "greeter-0.3.1" and value["drvPath"].endswith("greeter-0.3.1.drv")
    assert value["meta"]["mainProgram"] == "greeter"
    assert [entry["spdxId"] for entry in value["meta"]["license"]] == ["MIT", "Apache-2.0"]


def test_provides_every_licence_and_native_input_flakebot_emits(standin: Path) -> None:
    names = sorted(licenses.license_table())
    expression = f"map (n: lib.licenses.${{n}}.shortName) {json.dumps(names).replace(',', ' ')}"
    assert json_of(standin_eval(standin, expression)) == names
    paths = build_inputs.all_attribute_paths()
    drvs = " ".join(f"pkgs.{p}.drvPath" for p in paths)
    assert len(json_of(standin_eval(standin, f"[ {drvs} ]"))) == len(paths)  # type: ignore[arg-type]
    tools = json_of(standin_eval(standin, "map (p: p.name) (with pkgs; [ cargo rustc clippy rustfmt rust-analyzer ])"))
    assert tools == ["cargo-host", "rustc-host", "clippy-host", "rustfmt-host", "rust-analyzer-host"]


def test_lib_covers_the_four_systems(standin: Path) -> None:
    systems = json_of(standin_eval(standin, "builtins.attrNames (lib.genAttrs lib.systems.flakeExposed (s: s))"))
    assert systems == ["aarch64-darwin", "aarch64-linux", "x86_64-darwin", "x86_64-linux"]
    flake = json_of(standin_eval(standin, f'builtins.attrNames (builtins.getFlake "path:{standin}").legacyPackages'))
    assert flake == systems


def test_an_unfree_licence_is_refused_as_nixpkgs_refuses_it(standin: Path, tmp_path: Path) -> None:
    crate = greeter(tmp_path / "greeter")
    unfree = standin_eval(standin, f"({_call(crate, 'meta.license = lib.licenses.bsl11;')}).drvPath")
    assert unfree.returncode != 0
    assert "Package ‘greeter-0.3.1’ has an unfree license (‘bsl11’), refusing to evaluate." in unfree.stderr
    free = f"({_call(crate, 'meta.license = with lib.licenses; [ mit asl20 ];')}).drvPath"
    assert str(json_of(standin_eval(standin, free))).endswith("greeter-0.3.1.drv")


def test_a_build_sees_stdenv_programs_and_only_the_inputs_it_declares(standin: Path) -> None:
    host = json.loads((standin / "host.json").read_text())
    assert {"bash", "cc", "ld", "make", "sed", "tar"} <= set(host["stdenv"])
    assert not {"perl", "python3", "cmake", "protoc", "pkg-config"} & set(host["stdenv"])
    assert host["packages"]["perl"] == {"bin/perl": "/usr/bin/perl"}
    assert host["packages"]["zlib"]["lib/pkgconfig/zlib.pc"].endswith("/pkgconfig/zlib.pc")
    drv = json_of(standin_eval(standin, "pkgs.zlib.links"))
    assert drv == f"lib/pkgconfig/zlib.pc {host['packages']['zlib']['lib/pkgconfig/zlib.pc']}"


def test_a_declared_module_brings_the_modules_its_pc_file_requires(tmp_path: Path) -> None:
    """pkg-config refuses a module whose Requires(.private) it cannot find (libgit2.pc names libpcre2-8 and zlib):
    the attribute's placeholder links those .pc files too, as nixpkgs' closure of the attribute gives them."""
    pc_dir = tmp_path / "pkgconfig"
    pc_dir.mkdir()
    (pc_dir / "top.pc").write_text("Name: top\nRequires: mid >= 1.2, other\nRequires.private: low\n")
    (pc_dir / "mid.pc").write_text("Name: mid\nRequires.private: low = 3\n")
    assert pc_requires(pc_dir / "top.pc") == ["mid", "other", "low"]
    assert pc_requires(pc_dir / "mid.pc") == ["low"]
    host_pc = Path("/usr/lib/x86_64-linux-gnu/pkgconfig/libgit2.pc")
    if not host_pc.is_file():
        pytest.skip("libgit2-dev is not installed here")
    links = package_links(build_inputs.PACKAGES["libgit2"])
    assert {f"lib/pkgconfig/{m}.pc" for m in ["libgit2", *pc_requires(host_pc)]} <= set(links)
