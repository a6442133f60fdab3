"""Build scripts' own words for a program they could not run, mapped to the nixpkgs attribute that gives it, and
the inputs flakebot declares for crates nixpkgs packages, checked against nixpkgs' own expressions."""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest

from flakebot.nix import build_inputs, evidence
from flakebot.nix.flake import package_crate
from tests.fakes.nix_crates import host_settings, manifest, write


@pytest.mark.parametrize(
    ("line", "attribute"),
    [
        # curl-sys 0.4.58 build.rs (curl_config_reports_http2, Debian's librust-curl-sys-dev), as cargo prints a
        # failed build script's stdout inside the nix log
        (
            "cargo-c>   failed to run curl-config (No such file or directory (os error 2)), building from source",
            "curl.dev",
        ),
        # nasm-rs 0.2.4 (src/lib.rs is_nasm_found_and_new_enough) through a build script's unwrap, as the slow test
        # below sees it in a real nix build without nasm; and through rav1e 0.5.1 build.rs's expect
        (
            "asmtool>   called `Result::unwrap()` on an `Err` value: "
            '"Unable to run nasm: No such file or directory (os error 2)"',
            "nasm",
        ),
        (
            "rav1e>   thread 'main' panicked at 'NASM build failed. Make sure you have nasm installed. https://nasm.us: "
            '"Unable to run nasm: No such file or directory (os error 2)"\', build.rs:134:8',
            "nasm",
        ),
        ("  Couldn't find NASM", "nasm"),
        # prost-build, newer and older
        (
            "  thread 'main' panicked at 'Could not find `protoc` installation and this build crate cannot proceed "
            "without",
            "protobuf",
        ),
        (
            "  failed to invoke protoc (hint: https://docs.rs/prost-build/#sourcing-protoc): Os { code: 2, kind: "
            'NotFound, message: "No such file or directory" }',
            "protobuf",
        ),
        # the cmake crate, and perl's and make's words for a program they could not start
        ("  failed to execute command: No such file or directory (os error 2)", None),
        ("  is `cmake` not installed?", "cmake"),
        ('  Can\'t exec "perl": No such file or directory at ./Configure line 12.', "perl"),
        ('  failed to find tool "pkg-config": No such file or directory (os error 2)', "pkg-config"),
    ],
)
def test_a_build_scripts_program_not_found_line_maps_to_its_attribute(line: str, attribute: str | None) -> None:
    found = evidence.missing_inputs(["compiling", line])
    assert found == ({attribute: line.split("> ", 1)[-1].strip()} if attribute else {})


@pytest.mark.parametrize(
    "line",
    [
        "error: failed to run custom build command for `curl-sys v0.4.58`",  # cargo's own, names no program
        "  Couldn't find libcurl from pkgconfig (Command { ... }), compiling it from source...",  # a library: pkg-config's line says which
        "  could not find `Cargo.toml` in `/build/source` or any parent directory",
    ],
)
def test_lines_naming_no_program_add_nothing(line: str) -> None:
    assert evidence.missing_inputs([line]) == {}


def test_a_program_added_from_the_log_goes_to_native_build_inputs() -> None:
    inputs = build_inputs.native_inputs(["openssl-sys"])
    added = inputs.add_evidence(evidence.missing_inputs(["  Couldn't find NASM"]))
    assert added == ["nasm"] and "nasm" in inputs.native_build_inputs and "nasm" not in inputs.build_inputs


def test_inputs_for_crates_nixpkgs_packages_match_its_expressions() -> None:
    """nixpkgs' own expressions: pkgs/by-name/ca/cargo-c/package.nix (NixOS/nixpkgs at 0196f9867f42fcdb722a0c91da9c85bbbbc728fc)
    declares nativeBuildInputs = [ pkg-config (lib.getDev curl) ] and buildInputs = [ openssl curl ], and
    pkgs/by-name/ra/rav1e/package.nix (at 01eff1fc9f892ca6cae5e2ded2074c20c4f39d23) nativeBuildInputs = [ cargo-c
    nasm ] (cargo-c for its C library, which flakebot does not build). The crate names are those of their Cargo.lock
    that build_inputs.NATIVE_INPUTS keys on (cargo-c: curl-sys, openssl-sys, pkg-config; rav1e: nasm-rs)."""
    cargo_c = build_inputs.native_inputs(["curl", "curl-sys", "openssl", "openssl-sys", "pkg-config", "libz-sys"])
    assert {"pkg-config", "curl.dev"} <= set(cargo_c.native_build_inputs)
    assert {"openssl", "curl"} <= set(cargo_c.build_inputs)
    rav1e = build_inputs.native_inputs(["nasm-rs", "av1-grain", "rayon"])
    assert rav1e.native_build_inputs == ["nasm"] and rav1e.build_inputs == []
    assert rav1e.because["nasm"] == ["nasm-rs"]


def test_libslirp_sys_gets_libslirp_and_its_missing_module_line_names_it() -> None:
    """Debian's libslirp-sys 4.2.0 asks pkg-config for `slirp >= 4.2.0` (nixpkgs' `libslirp` gives slirp.pc); the
    line is the one its build script's panic quotes in a real nix build that lacked it (the corpus' libslirp)."""
    inputs = build_inputs.native_inputs(["libslirp", "libslirp-sys", "pkg-config"])
    assert inputs.build_inputs == ["libslirp", "glib"] and inputs.native_build_inputs == ["pkg-config"]
    assert evidence.missing_inputs(["  = note: /usr/bin/ld: cannot find -lglib-2.0: No such file or directory"]) == {
        "glib": "= note: /usr/bin/ld: cannot find -lglib-2.0: No such file or directory"
    }
    line = (
        '  called `Result::unwrap()` on an `Err` value: "`PKG_CONFIG_ALLOW_SYSTEM_CFLAGS=\\"1\\" \\"pkg-config\\" '
        '\\"--libs\\" \\"--cflags\\" \\"slirp >= 4.2.0\\"` did not exit successfully: exit status: 1\\nerror: could not '
        "find system library 'slirp >= 4.2.0' required by the 'libslirp-sys' crate\\n\\n--- stderr\\nPackage slirp was not "
        "found in the pkg-config search path.\\nPerhaps you should add the directory containing `slirp.pc'\\n"
    )
    assert list(evidence.missing_inputs([line])) == ["libslirp"]


ANSWER_ASM = "global answer\nsection .text\nanswer:\n    mov eax, 42\n    ret\n"


@pytest.mark.slow
def test_a_build_script_running_nasm_that_no_crate_name_announces_gets_nasm_from_its_own_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Debian's nasm-rs 0.2.4 assembles a file in the build script; with nasm-rs taken out of the crate-name table (a
    crate flakebot does not know), the nix build runs without nasm, fails with nasm-rs's own words ("Unable to run
    nasm: No such file or directory"), and is built again with nasm in nativeBuildInputs."""
    monkeypatch.delitem(build_inputs.NATIVE_INPUTS, "nasm-rs")
    marker = secrets.token_hex(8)
    build_rs = (
        f"// {marker}\nfn main() {{\n"
        '    nasm_rs::compile_library("libanswer.a", &["src/answer.asm"]).unwrap();\n'
        '    println!("cargo:rustc-link-lib=static=answer");\n}\n'
    )
    main = (
        'extern "C" { fn answer() -> i32; }\n'
        f'fn main() {{ println!("asmtool {marker}: the answer is {{}}\\n\\nUsage: asmtool [--help]", unsafe {{ answer() }}); }}\n'
    )
    cargo = manifest("asmtool") + '\n[build-dependencies]\nnasm-rs = "0.2"\n'
    crate = write(
        tmp_path / "crate",
        {"Cargo.toml": cargo, "build.rs": build_rs, "src/main.rs": main, "src/answer.asm": ANSWER_ASM},
    )
    result = package_crate(crate, tmp_path / "flake", host_settings(tmp_path))
    assert result.native_inputs["nativeBuildInputs"] == ["nasm"]
    [why] = result.native_inputs["because"]["nasm"]
    assert (
        why
        == 'build log: called `Result::unwrap()` on an `Err` value: "Unable to run nasm: No such file or directory (os error 2)"'
    )
    assert result.smoke["level"] == "help" and f"asmtool {marker}: the answer is 42" in result.smoke["output_head"]
    assert result.nix_run_program == ""  # evaluated beside the first build, of a flake built again: not kept
