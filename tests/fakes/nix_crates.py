"""Small crates written by the nix tests (real Cargo.toml + sources; cargo and nix build them for real)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path

from flakebot.config import Settings
from tests.fakes.registry import registry_for_tests

NIX = ["nix", "--extra-experimental-features", "nix-command flakes"]

GREETER_MAIN = """\
fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--help") {
        println!("greeter: says hello to NAME\\n\\nUSAGE: greeter NAME");
        return Ok(());
    }
    let name = args.first().ok_or_else(|| anyhow::anyhow!("give a NAME"))?;
    println!("hello, {name}");
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn greets() {
        assert_eq!(format!("hello, {}", "x"), "hello, x");
    }
}
"""


def write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def manifest(name: str, extra: str = "", deps: str = "") -> str:
    return f'[package]\nname = "{name}"\nversion = "0.3.1"\nedition = "2021"\n{extra}\n[dependencies]\n{deps}'


def greeter(root: Path) -> Path:
    """A binary crate with a dependency from Debian's registry (anyhow) and one unit test."""
    cargo = manifest(
        "greeter", 'description = "Says \\"hello\\" to ${NAME}"\nlicense = "MIT OR Apache-2.0"\n', 'anyhow = "1"\n'
    )
    return write(root, {"Cargo.toml": cargo, "src/main.rs": GREETER_MAIN, ".gitignore": "/target\nCargo.lock\n"})


def libc_tool(root: Path, name: str, version: str, marker: str, manifest_tail: str = "") -> Path:
    """A tool on libc and itoa (libc's build script says rerun-if-changed) with a build script of its own; `marker` is
    in every file a model would write, and the tool prints it twice (from main.rs and from its build script).
    The manifest's comments and key order depend on the name: tools that say the same say it differently."""
    manifest = (
        f'# {name}, written by a model\n[package]\nname = "{name}"\nversion = "{version}"\nedition = "2021"\n'
        f'description = "{marker}"\nbuild = "build.rs"\n\n[dependencies]\n'
        + ('itoa = "1"\nlibc = "0.2"\n' if name < "m" else 'libc = "0.2"  # the C library\nitoa = "1"\n')
        + manifest_tail
    )
    main = f'fn main() {{ println!("{marker} {{}} {{}}", env!("MARKER"), itoa::Buffer::new().format(unsafe {{ libc::abs(-7) }})); }}\n'
    build = f'fn main() {{ println!("cargo:rustc-env=MARKER={marker}"); }}\n'
    return write(root, {"Cargo.toml": manifest, "src/main.rs": main, "build.rs": build})


def lib_workspace(root: Path, marker: str) -> Path:
    """A workspace: app (binary app-cli at cli/run.rs) on core-lib (a library with a build script, on libc) by path
    with a version requirement; app-cli prints core-lib's marker and the one its build script set. core-lib's version
    is the skeleton's own (0.0.0): only leaving the skeleton's units out of the deps derivation keeps its empty
    core-lib from passing for the real one."""
    return write(
        root,
        {
            "Cargo.toml": '[workspace]\nmembers = ["app", "core-lib"]\nresolver = "2"\n',
            "app/Cargo.toml": '[package]\nname = "app"\nversion = "2.0.0"\nedition = "2021"\n\n[[bin]]\nname = "app-cli"\n'
            'path = "cli/run.rs"\n\n[dependencies]\ncore-lib = { path = "../core-lib", version = "0.0" }\nitoa = "1"\n',
            "app/cli/run.rs": 'fn main() { println!("{} {}", core_lib::MARKER, core_lib::BUILT); }\n',
            "core-lib/Cargo.toml": '[package]\nname = "core-lib"\nversion = "0.0.0"\nedition = "2021"\n'
            '\n[dependencies]\nlibc = "0.2"\n',
            "core-lib/src/lib.rs": f'pub const MARKER: &str = "{marker}";\npub const BUILT: &str = env!("MARKER");\n',
            "core-lib/build.rs": f'fn main() {{ println!("cargo:rustc-env=MARKER=built-{marker}"); }}\n',
        },
    )


def two_binaries(root: Path) -> Path:
    """A virtual workspace with two member crates, each shipping one binary (alpha and beta)."""
    files = {"Cargo.toml": '[workspace]\nmembers = ["alpha", "beta"]\nresolver = "2"\n'}
    for name in ("alpha", "beta"):
        files[f"{name}/Cargo.toml"] = manifest(name, 'license = "MIT"\n')
        files[f"{name}/src/main.rs"] = (
            f'fn main() {{ let a: Vec<String> = std::env::args().skip(1).collect(); println!("{name} says {{}}", a.join(" ")); }}\n'
        )
    return write(root, files)


def library(root: Path) -> Path:
    return write(root, {"Cargo.toml": manifest("just-a-lib"), "src/lib.rs": "pub fn answer() -> u32 { 42 }\n"})


def unresolvable(root: Path) -> Path:
    """A binary crate depending on a crate that no local registry has."""
    return write(
        root,
        {
            "Cargo.toml": manifest("needs-missing", deps='flakebot-no-such-crate = "1"\n'),
            "src/main.rs": "fn main() {}\n",
        },
    )


def broken(root: Path) -> Path:
    """A binary crate that does not compile."""
    return write(
        root,
        {
            "Cargo.toml": manifest("broken"),
            "src/main.rs": 'fn main() {\n    let x: u32 = undefined_value;\n    println!("{x}");\n}\n',
        },
    )


def many_errors(root: Path, count: int = 40) -> Path:
    """A binary crate with `count` compile errors: the first scrolls far out of a 30-line log tail."""
    lines = "".join(f"    let v{i}: u32 = undefined_{i};\n" for i in range(count))
    return write(root, {"Cargo.toml": manifest("many-errors"), "src/main.rs": f"fn main() {{\n{lines}}}\n"})


def host_settings(home: Path) -> Settings:
    """Settings for building offline with the stand-in, everything under `home`."""
    return Settings(
        workdir=str(home / "work"),
        cache_dir=str(home / "cache"),
        catalog_dir=str(home / "catalog"),
        nixpkgs="host",
        registry="local",
        local_registry=str(registry_for_tests()),
    )


def standin_eval(standin: Path, expression: str) -> subprocess.CompletedProcess[str]:
    """`nix eval --json` of `expression` with `pkgs` bound to the stand-in's legacyPackages.x86_64-linux."""
    expr = (
        f'let pkgs = (builtins.getFlake "path:{standin}").legacyPackages.x86_64-linux; lib = pkgs.lib; in {expression}'
    )
    return subprocess.run(
        [*NIX, "eval", "--impure", "--json", "--expr", expr], capture_output=True, text=True, timeout=120
    )


def json_of(result: subprocess.CompletedProcess[str]) -> object:
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


# ---------------------------------------------------------------- crates whose shape flakebot must work around

HELP_MAIN = 'fn main() {{ println!("{name}: a small tool\\n\\nUSAGE: {name} [--help]"); }}\n'


def directory_source(root: Path, crates: dict[str, str]) -> Path:
    """A cargo directory source holding library crates {name: version}, as Debian's registry holds its crates."""
    for name, version in crates.items():
        crate = root / f"{name}-{version}"
        write(
            crate,
            {
                "Cargo.toml": f'[package]\nname = "{name}"\nversion = "{version}"\nedition = "2021"\n',
                "src/lib.rs": "pub fn help() {}\n",
            },
        )
        (crate / ".cargo-checksum.json").write_text(json.dumps({"package": "0" * 64, "files": {}}))
    root.chmod(0o755)  # readable by all, as Debian's is: Nix's build users read it (tmp_path is 0700)
    return root


def source_settings(home: Path, source: Path) -> Settings:
    """host_settings, with `source` as the crate directory source (for cargo and the stand-in alike)."""
    return dataclasses.replace(host_settings(home), local_registry=str(source))


def dev_missing(root: Path) -> Path:
    """A tool whose dev-dependency no registry has (its test uses it); `okhelper` resolves and stays."""
    dev = '\n[dev-dependencies]\nflakebot-no-such-crate = "1"\nokhelper = "1"\n'
    files = {
        "Cargo.toml": manifest("devmissing", deps='helper = "0.9"\n') + dev,
        "src/main.rs": HELP_MAIN.format(name="devmissing"),
    }
    files["tests/cli.rs"] = "#[test]\nfn uses_it() { flakebot_no_such_crate::help(); }\n"
    return write(root, files)


def dev_mismatch(root: Path) -> Path:
    """A tool whose dev-dependency asks for helper 0.6 where the source has only 0.9."""
    dev = "\n[target.'cfg(unix)'.dev-dependencies]\nhelper = \"0.6\"\n"
    return write(
        root, {"Cargo.toml": manifest("devmismatch") + dev, "src/main.rs": HELP_MAIN.format(name="devmismatch")}
    )


def needs_features(root: Path) -> Path:
    """A crate whose only binary has required-features = ["cli"]."""
    extra = '\n[features]\ncli = []\n\n[[bin]]\nname = "featured"\npath = "src/main.rs"\nrequired-features = ["cli"]\n'
    return write(
        root,
        {
            "Cargo.toml": manifest("featured") + extra,
            "src/lib.rs": "",
            "src/main.rs": HELP_MAIN.format(name="featured"),
        },
    )


# What pkg-config prints for a missing module; the build script fails with it until the flake gives zlib.
ZLIB_BUILD_RS = """\
fn main() {
    if !std::env::var("buildInputs").unwrap_or_default().contains("zlib") {
        eprintln!("Package zlib was not found in the pkg-config search path.");
        std::process::exit(1);
    }
}
"""


def needs_zlib(root: Path) -> Path:
    """A crate whose build fails as a -sys crate's does when pkg-config cannot find zlib (no crate name says so)."""
    return write(
        root,
        {
            "Cargo.toml": manifest("zlibuser"),
            "build.rs": ZLIB_BUILD_RS,
            "src/main.rs": HELP_MAIN.format(name="zlibuser"),
        },
    )


# ---------------------------------------------------------------- crates the stricter stand-in refuses until declared

PROBE_BUILD_RS = """\
// {marker}
fn main() {{
    // the pkg-config crate from Debian's registry, as -sys crates use it: it runs pkg-config, which must find zlib.pc
    let zlib = pkg_config::probe_library("zlib").unwrap_or_else(|e| panic!("{{e}}"));
    println!("cargo:rustc-env=ZLIB_LIBS={{:?}}", zlib.libs);
}}
"""

PROBE_MAIN = """\
extern "C" {
    fn zlibVersion() -> *const std::os::raw::c_char;
}

fn main() {
    let version = unsafe { std::ffi::CStr::from_ptr(zlibVersion()) };
    println!("zprobe: links zlib {} ({})\\n\\nUSAGE: zprobe [--help]", version.to_str().unwrap(), env!("ZLIB_LIBS"));
}
"""


def zlib_probe(root: Path, marker: str) -> Path:
    """A crate whose build script finds zlib with the pkg-config crate (Debian's), and links it: no crate names zlib."""
    return write(
        root,
        {
            "Cargo.toml": manifest("zprobe", deps='\n[build-dependencies]\npkg-config = "0.3"\n'),
            "build.rs": PROBE_BUILD_RS.format(marker=marker),
            "src/main.rs": PROBE_MAIN,
        },
    )


def zlib_linker(root: Path, marker: str) -> Path:
    """A crate that links zlib by name alone (`cargo:rustc-link-lib=z`, no pkg-config), as some -sys crates do."""
    build_rs = (
        f'// {marker}\nfn main() {{ println!("cargo:rustc-link-lib=z"); println!("cargo:rustc-env=ZLIB_LIBS=z"); }}\n'
    )
    return write(root, {"Cargo.toml": manifest("zprobe"), "build.rs": build_rs, "src/main.rs": PROBE_MAIN})


def perl_user(root: Path, marker: str) -> Path:
    """A crate whose build script runs perl through sh (as a configure step does) and keeps what it printed."""
    build_rs = (
        f"// {marker}\n"
        "fn main() {\n"
        '    let out = std::process::Command::new("sh").args(["-c", "perl -e \'print 6*7\'"]).output().unwrap();\n'
        '    eprintln!("{}", String::from_utf8_lossy(&out.stderr));\n'
        '    assert!(out.status.success(), "perl failed");\n'
        '    println!("cargo:rustc-env=PERL_SAID={}", String::from_utf8_lossy(&out.stdout));\n'
        "}\n"
    )
    main = 'fn main() { println!("perluser: perl said {}\\n\\nUSAGE: perluser [--help]", env!("PERL_SAID")); }\n'
    return write(root, {"Cargo.toml": manifest("perluser"), "build.rs": build_rs, "src/main.rs": main})


def home_writer(root: Path, marker: str) -> Path:
    """A crate whose test writes a file into $HOME (nixpkgs builds have HOME=/homeless-shelter, which cannot be made)."""
    main = (
        HELP_MAIN.format(name="homewriter")
        + "\n#[cfg(test)]\nmod tests {\n    #[test]\n    fn writes_home() {\n"
        + f'        let file = std::path::Path::new(&std::env::var("HOME").unwrap()).join("{marker}");\n'
        + '        std::fs::create_dir_all(file.parent().unwrap()).unwrap();\n        std::fs::write(&file, "x").unwrap();\n'
        + "    }\n}\n"
    )
    return write(root, {"Cargo.toml": manifest("homewriter"), "src/main.rs": main})
