"""What the flake learns from cargo (real cargo, offline against Debian's registry): binaries, workspaces, the lock."""

from __future__ import annotations

from pathlib import Path

import pytest

from flakebot.errors import NixError
from flakebot.nix.crate import inspect_crate, workspace_root
from flakebot.nix.flake_files import copy_sources
from tests.fakes.nix_crates import greeter, host_settings, two_binaries, write


def test_single_binary_crate_needs_no_selection_flags(tmp_path: Path) -> None:
    crate = greeter(tmp_path / "greeter")
    facts = inspect_crate(crate, host_settings(tmp_path))
    assert (facts.pname, facts.version, facts.bin_name, facts.license) == (
        "greeter",
        "0.3.1",
        "greeter",
        "MIT OR Apache-2.0",
    )
    assert facts.cargo_build_flags == [] and facts.cargo_test_flags == []
    assert facts.lock_generated and (crate / "Cargo.lock").is_file() and "anyhow" in facts.lock_crates
    assert inspect_crate(crate, host_settings(tmp_path)).lock_generated is False  # an existing lock is kept


def test_workspace_member_directory_packages_the_whole_workspace(tmp_path: Path) -> None:
    ws = two_binaries(tmp_path / "ws")
    settings = host_settings(tmp_path)
    assert workspace_root(ws / "beta", settings) == ws.resolve()
    assert workspace_root(ws, settings) == ws
    facts = inspect_crate(ws, settings, member="beta")
    assert (facts.pname, facts.bin_name) == ("beta", "beta")
    assert facts.cargo_build_flags == ["-p", "beta", "--bin", "beta"] and facts.cargo_test_flags == ["-p", "beta"]


def test_prefer_bin_falls_back_to_the_crates_own_binary(tmp_path: Path) -> None:
    crate = greeter(tmp_path / "greeter")
    assert inspect_crate(crate, host_settings(tmp_path), prefer_bin="not-a-binary").bin_name == "greeter"
    extra = write(tmp_path / "two", {"Cargo.toml": '[package]\nname = "two"\nversion = "1.0.0"\nedition = "2021"\n'})
    write(extra, {"src/main.rs": "fn main() {}\n", "src/bin/helper.rs": "fn main() {}\n"})
    facts = inspect_crate(extra, host_settings(tmp_path), prefer_bin="helper")
    assert facts.bin_name == "helper" and facts.cargo_build_flags == ["--bin", "helper"]
    # the package's own name is its default binary
    assert inspect_crate(extra, host_settings(tmp_path)).bin_name == "two"


def test_copy_leaves_out_build_output_vcs_and_registry_files(tmp_path: Path) -> None:
    crate = greeter(tmp_path / "greeter")
    write(
        crate,
        {
            "target/release/old": "x",
            ".cargo-checksum.json": "{}",
            "debian/patches/series": "",
            "result": "link?",
            "results.csv": "kept",
            "sub/result": "kept",
        },
    )
    dest = tmp_path / "dest"
    dest.mkdir()
    copy_sources(crate, dest)
    copied = sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file())
    assert copied == [".gitignore", "Cargo.toml", "results.csv", "src/main.rs", "sub/result"]


def test_copy_drops_what_steers_cargo_and_refuses_links_leaving_the_tree(tmp_path: Path) -> None:
    crate = greeter(tmp_path / "greeter")
    write(
        crate,
        {
            ".cargo/config.toml": "[build]\nrustc-wrapper = '/tmp/pwn'\n",
            "rust-toolchain.toml": "[toolchain]\nchannel = 'nightly'\n",
            "sub/rust-toolchain": "x",
        },
    )
    (crate / "docs").mkdir()
    (crate / "docs/readme.txt").write_text("inside")
    (crate / "link-inside").symlink_to("docs/readme.txt")
    dest = tmp_path / "dest"
    dest.mkdir()
    copy_sources(crate, dest)
    assert (
        not (dest / ".cargo").exists()
        and not (dest / "rust-toolchain.toml").exists()
        and not (dest / "sub/rust-toolchain").exists()
    )
    assert (dest / "link-inside").is_symlink()
    secret = tmp_path / "id_ed25519"
    secret.write_text("host secret")
    (crate / "notes.txt").symlink_to(secret)
    with pytest.raises(NixError, match="notes.txt is a symbolic link to .*id_ed25519, outside the crate"):
        copy_sources(crate, tmp_path / "dest2")
    assert "host secret" not in "".join(
        p.read_text() for p in (tmp_path / "dest2").rglob("*") if p.is_file() and not p.is_symlink()
    )


def test_all_bins_installs_every_binary_of_the_package_with_the_preferred_one_as_main(tmp_path: Path) -> None:
    crate = write(tmp_path / "two", {"Cargo.toml": '[package]\nname = "two"\nversion = "1.0.0"\nedition = "2021"\n'})
    write(crate, {"src/main.rs": "fn main() {}\n", "src/bin/helper.rs": "fn main() {}\n"})
    facts = inspect_crate(crate, host_settings(tmp_path), prefer_bin="two", all_bins=True)
    assert facts.bin_name == "two" and facts.cargo_build_flags == []


@pytest.mark.parametrize(
    ("extra", "chosen", "why"),
    [("", "beta", "the first"), ('default-run = "gamma"\n', "gamma", "its default-run")],
)
def test_several_binaries_of_one_package_are_all_installed_and_one_picked(
    tmp_path: Path, extra: str, chosen: str, why: str
) -> None:
    manifest = f'[package]\nname = "tools"\nversion = "1.0.0"\nedition = "2021"\n{extra}'
    crate = write(tmp_path / "tools", {"Cargo.toml": manifest, "src/bin/beta.rs": "fn main() {}\n"})
    write(crate, {"src/bin/gamma.rs": "fn main() {}\n"})
    facts = inspect_crate(crate, host_settings(tmp_path))
    assert facts.bin_name == chosen and facts.cargo_build_flags == []  # no --bin: every binary is installed
    assert facts.chosen_because == (
        f"tools has several binaries (beta, gamma): all are installed, {chosen} ({why}) is mainProgram and the one "
        "`nix run` starts; choose another with --bin NAME"
    )
    named = inspect_crate(crate, host_settings(tmp_path), bin_name="gamma")
    assert named.chosen_because == "" and named.cargo_build_flags == ["--bin", "gamma"]
