"""Crate shapes that once stopped `flakebot package`, made here against a small directory source:
dev-dependencies the source cannot satisfy, a binary with required-features, a build that needs a library
no crate name announces. Real cargo decides what resolves; the slow tests build each with nix and run it."""

from __future__ import annotations

import secrets
import subprocess
import tomllib
from pathlib import Path

import pytest

from flakebot.errors import NixError
from flakebot.nix import devdeps, evidence
from flakebot.nix.crate import inspect_crate
from flakebot.nix.evidence import LINK_LIBRARIES
from flakebot.nix.flake import PackageResult, flake_check, package_crate
from tests.fakes.nix_crates import (
    dev_mismatch,
    dev_missing,
    directory_source,
    home_writer,
    host_settings,
    manifest,
    needs_features,
    needs_zlib,
    perl_user,
    source_settings,
    unresolvable,
    write,
    zlib_linker,
    zlib_probe,
)


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return directory_source(
        tmp_path_factory.mktemp("source"), {"helper": "0.9.0", "okhelper": "1.0.0", "pcap-sys": "0.1.0"}
    )


def test_a_missing_dev_dependency_is_left_out_and_one_that_resolves_is_kept(tmp_path: Path, source: Path) -> None:
    crate = dev_missing(tmp_path / "crate")
    facts = inspect_crate(crate, source_settings(tmp_path, source))
    [dropped] = facts.dropped_dev_dependencies
    assert (dropped["name"], dropped["manifest"], dropped["table"]) == (
        "flakebot-no-such-crate",
        "Cargo.toml",
        "dev-dependencies",
    )
    assert "no matching package named `flakebot-no-such-crate` found" in dropped["reason"]  # cargo's own words
    manifest = tomllib.loads((crate / "Cargo.toml").read_text())
    assert manifest["dev-dependencies"] == {"okhelper": "1"} and manifest["dependencies"] == {"helper": "0.9"}
    assert {"helper", "okhelper"} <= set(facts.lock_crates) and facts.lock_generated


def test_a_dev_dependency_requirement_the_source_cannot_meet_is_left_out(tmp_path: Path, source: Path) -> None:
    crate = dev_mismatch(tmp_path / "crate")
    [dropped] = inspect_crate(crate, source_settings(tmp_path, source)).dropped_dev_dependencies
    assert (dropped["name"], dropped["table"]) == ("helper", "target.cfg(unix).dev-dependencies")
    assert 'failed to select a version for the requirement `helper = "^0.6"`' in dropped["reason"]
    assert "helper" not in (crate / "Cargo.toml").read_text()


def test_a_missing_normal_dependency_still_fails_and_the_manifest_is_restored(tmp_path: Path, source: Path) -> None:
    crate = unresolvable(tmp_path / "crate")
    (crate / "Cargo.toml").write_text((crate / "Cargo.toml").read_text() + '\n[dev-dependencies]\nokhelper = "1"\n')
    before = (crate / "Cargo.toml").read_text()
    with pytest.raises(NixError, match="cannot produce Cargo.lock.*flakebot-no-such-crate"):
        inspect_crate(crate, source_settings(tmp_path, source))
    assert (crate / "Cargo.toml").read_text() == before


def test_required_features_of_the_chosen_binary_are_turned_on(tmp_path: Path, source: Path) -> None:
    facts = inspect_crate(needs_features(tmp_path / "crate"), source_settings(tmp_path, source))
    assert (facts.bin_name, facts.build_features) == ("featured", ["cli"])


def test_dev_dependency_tables_are_found_plain_old_spelling_and_per_target() -> None:
    text = '[dev-dependencies]\na = "1"\n[dev_dependencies]\nb = "1"\n[target."cfg(windows)".dev-dependencies]\nc = { version = "1" }\n'
    found = devdeps.dev_dependencies("x/Cargo.toml", text)
    assert [(d.table, d.name) for d in found] == [
        (("dev-dependencies",), "a"),
        (("dev_dependencies",), "b"),
        (("target", "cfg(windows)", "dev-dependencies"), "c"),
    ]


@pytest.mark.parametrize(
    ("line", "attribute"),
    [
        ("pcap-sys> Package libpcap was not found in the pkg-config search path.", "libpcap"),
        ("  The system library `nettle` required by crate `nettle-sys` was not found.", "nettle"),
        ("Package 'sqlite3', required by 'virtual:world', not found", "sqlite"),
        ("          /usr/bin/ld: cannot find -lz: No such file or directory", "zlib"),
        ("rust-lld: error: unable to find library -lssl", "openssl"),
        ("perluser> sh: 1: perl: not found", "perl"),
        ("  bash: line 1: python3: command not found", "python3"),
        ("The pkg-config command could not be found.", "pkg-config"),
        ("  is `cmake` not installed?", "cmake"),
    ],
)
def test_build_log_lines_map_to_nixpkgs_attributes(line: str, attribute: str) -> None:
    assert evidence.missing_inputs(["compiling", line]) == {attribute: line.split("> ", 1)[-1].strip()}


def test_every_input_flakebot_declares_is_in_the_one_table() -> None:
    """build_inputs.PACKAGES is what the stand-in provides: what crate names or a build log add must be in it."""
    from flakebot.nix import build_inputs

    named = {name for needs in build_inputs.NATIVE_INPUTS.values() for name in needs.native + needs.build}
    read = {*evidence.PKG_CONFIG_MODULES.values(), *evidence.LINK_LIBRARIES.values(), *evidence.PROGRAMS.values()}
    assert named | read <= set(build_inputs.PACKAGES) and evidence.LINK_LIBRARIES["ssl"] == "openssl"


def test_unknown_libraries_in_a_build_log_add_nothing() -> None:
    assert evidence.missing_inputs(["/usr/bin/ld: cannot find -lflakebotnothing", "error: could not compile"]) == {}


# ---------------------------------------------------------------- built with nix and run


def _package(crate: Path, home: Path, source: Path) -> PackageResult:
    return package_crate(crate, home / "flake", source_settings(home, source))


@pytest.mark.slow
def test_crate_with_a_missing_dev_dependency_builds_runs_and_says_what_was_left_out(
    tmp_path: Path, source: Path
) -> None:
    result = _package(dev_missing(tmp_path / "crate"), tmp_path, source)
    assert result.smoke["exit_code"] == 0 and "devmissing: a small tool" in result.smoke["output_head"]
    assert any(
        n.startswith("dev-dependency flakebot-no-such-crate (Cargo.toml) left out: ") and "no matching package" in n
        for n in result.notices
    )
    assert [d["name"] for d in result.dropped_dev_dependencies] == ["flakebot-no-such-crate"]
    flake = (Path(result.flake_dir) / "flake.nix").read_text()
    assert (
        "checks = " not in flake
        and "no checks: the crate's tests need dev-dependencies left out of this copy: flakebot-no-such-crate" in flake
    )


@pytest.mark.slow
def test_crate_with_a_mismatched_dev_dependency_builds_and_runs(tmp_path: Path, source: Path) -> None:
    result = _package(dev_mismatch(tmp_path / "crate"), tmp_path, source)
    assert result.smoke["exit_code"] == 0
    assert any(n.startswith("dev-dependency helper (Cargo.toml) left out: ") and "^0.6" in n for n in result.notices)


@pytest.mark.slow
def test_binary_with_required_features_is_built_with_them(tmp_path: Path, source: Path) -> None:
    result = _package(needs_features(tmp_path / "crate"), tmp_path, source)
    assert result.main_program == "featured" and result.smoke["exit_code"] == 0
    assert "featured needs --features cli: turned on (buildFeatures)" in result.notices and result.build_features == [
        "cli"
    ]
    assert 'buildFeatures = [ "cli" ];' in (Path(result.flake_dir) / "flake.nix").read_text()


@pytest.mark.slow
def test_a_library_the_build_log_asks_for_is_added_and_built_again(tmp_path: Path, source: Path) -> None:
    result = _package(needs_zlib(tmp_path / "crate"), tmp_path, source)
    assert result.smoke["exit_code"] == 0
    assert result.native_inputs["buildInputs"] == ["zlib"]
    assert result.native_inputs["because"]["zlib"] == [
        "build log: Package zlib was not found in the pkg-config search path."
    ]
    assert "buildInputs = with pkgs; [ zlib ];" in (Path(result.flake_dir) / "flake.nix").read_text()


@pytest.mark.slow
def test_a_library_the_flake_gives_but_the_host_lacks_is_named_with_the_fix(tmp_path: Path, source: Path) -> None:
    build_rs = 'fn main() { eprintln!("Package libpcap was not found in the pkg-config search path."); std::process::exit(1); }\n'
    crate = write(
        tmp_path / "crate",
        {
            "Cargo.toml": manifest("pcapuser", deps='pcap-sys = "0.1"\n'),
            "build.rs": build_rs,
            "src/main.rs": "fn main() {}\n",
        },
    )
    with pytest.raises(NixError) as caught:
        _package(crate, tmp_path, source)
    assert (
        caught.value.message
        == "nix build of pcapuser failed: it found no libpcap (Package libpcap was not found in the pkg-config search path.)"
    )
    assert caught.value.fix is not None and caught.value.fix.startswith(
        "the host stand-in links this machine's own libraries: install the development package of libpcap"
    )


# ---------------------------------------------------------------- the stricter stand-in: refused until declared, then added


@pytest.mark.slow
def test_an_undeclared_pkg_config_module_fails_and_the_build_log_adds_it(tmp_path: Path) -> None:
    """The pkg-config crate (Debian's) finds zlib only once the flake declares it, although the host has zlib.pc."""
    crate = zlib_probe(tmp_path / "crate", secrets.token_hex(8))
    result = package_crate(crate, tmp_path / "flake", host_settings(tmp_path))
    assert result.native_inputs["nativeBuildInputs"] == ["pkg-config"]  # from the pkg-config crate in Cargo.lock
    assert result.native_inputs["buildInputs"] == ["zlib"]
    [why] = result.native_inputs["because"]["zlib"]
    assert why.startswith("build log: ") and "zlib" in why  # the first build failed: it was not declared
    assert result.smoke["exit_code"] == 0 and "zprobe: links zlib 1." in result.smoke["output_head"]
    assert "buildInputs = with pkgs; [ zlib ];" in (Path(result.flake_dir) / "flake.nix").read_text()


@pytest.mark.slow
def test_linking_an_undeclared_library_fails_and_the_build_log_adds_it(tmp_path: Path, source: Path) -> None:
    """-lz of a nixpkgs attribute the flake does not declare: the stand-in's cc refuses it as ld would find nothing."""
    result = _package(zlib_linker(tmp_path / "crate", secrets.token_hex(8)), tmp_path, source)
    assert result.native_inputs["buildInputs"] == ["zlib"]
    [why] = result.native_inputs["because"]["zlib"]
    assert why.startswith("build log: ") and "cannot find -lz" in why
    assert result.smoke["exit_code"] == 0 and "zprobe: links zlib 1." in result.smoke["output_head"]


@pytest.mark.slow
def test_linking_a_library_outside_the_table_fails_naming_it_and_how_to_add_it(tmp_path: Path, source: Path) -> None:
    """-lNAME of a host library no attribute of build_inputs.PACKAGES gives (nixpkgs would need it declared): refused,
    and the error names the library and the table to add it to. The host's own cc links it (the control)."""
    names = [
        n
        for n in ("uuid", "xml2", "magic", "yaml")
        if n not in LINK_LIBRARIES and Path(f"/usr/lib/x86_64-linux-gnu/lib{n}.so").exists()
    ]
    if not names:
        pytest.skip("none of libuuid, libxml2, libmagic, libyaml is installed here")
    name = names[0]
    program = tmp_path / "control"
    control = subprocess.run(
        ["cc", "-x", "c", "-", "-o", str(program), f"-l{name}"], input="int main(void){return 0;}\n", text=True
    )
    assert control.returncode == 0  # the host links it: only the stand-in refuses
    build_rs = f'// {secrets.token_hex(8)}\nfn main() {{ println!("cargo:rustc-link-lib={name}"); }}\n'
    crate = write(
        tmp_path / "crate", {"Cargo.toml": manifest("outsider"), "build.rs": build_rs, "src/main.rs": "fn main() {}\n"}
    )
    with pytest.raises(NixError) as caught:
        _package(crate, tmp_path, source)
    assert caught.value.message == (
        f"nix build of outsider failed: it links -l{name}, which no nixpkgs attribute in flakebot's table gives"
    )
    assert (caught.value.fix or "").startswith(f"add the nixpkgs attribute that ships lib{name}.so to PACKAGES")


@pytest.mark.slow
def test_an_undeclared_perl_fails_and_the_build_log_adds_it(tmp_path: Path, source: Path) -> None:
    """perl is on the host, but a build sees it only once nativeBuildInputs names it."""
    result = _package(perl_user(tmp_path / "crate", secrets.token_hex(8)), tmp_path, source)
    assert result.native_inputs["nativeBuildInputs"] == ["perl"] and result.native_inputs["buildInputs"] == []
    [why] = result.native_inputs["because"]["perl"]
    assert why.startswith("build log: ") and "perl: not found" in why
    assert result.smoke["exit_code"] == 0 and "perluser: perl said 42" in result.smoke["output_head"]


@pytest.mark.slow
def test_a_test_that_writes_to_home_fails_as_under_nixpkgs(tmp_path: Path, source: Path) -> None:
    """HOME is Nix's /homeless-shelter, which a build user cannot make: `nix flake check` (the crate's tests) fails."""
    marker = secrets.token_hex(8)
    result = _package(home_writer(tmp_path / "crate", marker), tmp_path, source)  # the package itself runs no tests
    check = flake_check(result.flake_dir, source_settings(tmp_path, source))
    assert check.returncode != 0
    assert "writes_home" in check.stderr and "FAILED" in check.stderr and "Permission denied" in check.stderr
    assert not list(Path("/").glob(f"*/{marker}")) and not (Path.home() / marker).exists()


@pytest.mark.slow
def test_a_flake_that_builds_is_kept_when_its_smoke_run_fails(tmp_path: Path, source: Path) -> None:
    main = f'fn main() {{ eprintln!("{secrets.token_hex(8)}: no help here"); std::process::exit(3); }}\n'
    crate = write(tmp_path / "crate", {"Cargo.toml": manifest("nohelp"), "src/main.rs": main})
    with pytest.raises(NixError) as caught:
        _package(crate, tmp_path, source)
    assert caught.value.message.startswith("smoke run failed: 'nohelp --help' exited 3")
    flake = tmp_path / "flake"
    assert (flake / "flake.nix").is_file() and caught.value.details["flake_dir"] == str(flake)
    assert (caught.value.fix or "").endswith(f"the flake builds and is kept in {flake} (nix build {flake})")


@pytest.mark.slow
def test_a_build_failing_only_on_a_denied_lint_is_built_again_with_capped_lints(tmp_path: Path, source: Path) -> None:
    """`#![deny(warnings)]` meets warnings (as a newer compiler's new lints do): built again, warnings allowed. Forty
    of them: the note naming the lint level comes with the first only, far above the log's last 30 lines."""
    unused = "".join(f'    let unused_{i} = "{secrets.token_hex(8)}";\n' for i in range(40))
    main = f'#![deny(warnings)]\nfn main() {{\n{unused}    println!("linty: a small tool");\n}}\n'
    crate = write(tmp_path / "crate", {"Cargo.toml": manifest("linty"), "src/main.rs": main})
    result = _package(crate, tmp_path, source)
    assert result.smoke["exit_code"] == 0 and result.native_inputs["env"] == {"RUSTFLAGS": "--cap-lints warn"}
    assert '"RUSTFLAGS" = "--cap-lints warn";' in (Path(result.flake_dir) / "flake.nix").read_text()
    [notice] = [n for n in result.notices if "denies" in n]
    assert (
        notice.startswith("the build failed only on a lint the crate denies (")
        and "RUSTFLAGS=--cap-lints warn" in notice
    )


@pytest.mark.slow
def test_a_real_compile_error_is_not_taken_for_a_lint(tmp_path: Path, source: Path) -> None:
    main = f'#![deny(warnings)]\nfn main() {{\n    let unused = "{secrets.token_hex(8)}";\n    let n: u32 = "x";\n}}\n'
    crate = write(tmp_path / "crate", {"Cargo.toml": manifest("broken"), "src/main.rs": main})
    said: list[str] = []
    with pytest.raises(NixError) as caught:
        package_crate(crate, tmp_path / "flake", source_settings(tmp_path, source), progress=said.append)
    assert "mismatched types" in caught.value.message and not [line for line in said if "lint" in line]
