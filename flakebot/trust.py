"""The trust boundary in one place: which steps run on the host, and what of a model-touched tree they may use.

Trusted host steps (network allowed; no model-written code runs; nothing in the tree steers them):

    search, clone/fork             crate metadata and git objects, no build
    git (clone, commit, diff...)   only through flakebot.source.safegit: no system/global config, no hooks,
                                   fsmonitor, submodules, LFS or credential helpers, no key in its environment;
                                   in the model's tree every nested .git (dir, gitdir: file, link, any case) is
                                   removed before each call, and the file tools refuse any path with a .git part
    cargo fetch/add/metadata/      from a neutral cwd with --manifest-path, minimal environment, flakebot's
    generate-lockfile              own CARGO_HOME and a pinned toolchain (flakebot.cargo.runner); only after every
                                   source the tree names passed the allow-list (flakebot.cargo.sources: crates.io,
                                   https git on the git_sources hosts, paths inside the tree; manifest and lock)
    copying the tree               copy_sources: drops STEERING files, refuses links leaving the tree
    acquiring the tree             clone, copy or unpack refuses any link pointing out of the tree
                                   (source.tree.refuse_links_leaving) before cargo metadata or any later step
    files in untrusted trees       every host read, write, mkdir, rename, remove, chmod or lock inside a tree a
                                   sandbox, a repository, a cache owner or a tool could have written (the
                                   workspace, a target dir, a dependency-cache build, a shared catalog directory)
                                   goes through flakebot.safefs.Tree: each component opened beneath a trusted
                                   directory descriptor with O_NOFOLLOW, '..' and absolute paths refused, files
                                   replaced by an O_EXCL temp renamed within one descriptor (a link or hard link
                                   at the name is replaced, never written through), only regular files read or
                                   locked (a FIFO cannot hang the host), a lock never truncated or written;
                                   tests/test_layout.py keeps raw writes out of the modules that handle such
                                   trees, listing the few trusted-root writes left and why their root is trusted
    a deps derivation's output     the loop's index entry (cache_dir/deps-derivations/KEY) is taken only when every
    (flakebot.nix.loopdeps)        hop stays in /nix/store: the link names a direct child, itself a directory (not a
                                   link), and its target/ too; before `cp -r -P` copies target/ into the loop's
                                   target dir, everything under it is walked beneath a descriptor (safefs) and any
                                   link that is absolute or has a '..' part refuses the copy (whoever may add to the
                                   store chooses a store path's contents; the store is read-only, so the check holds)
    nix copy to a file:// cache    `publish` runs nix copy into a fresh directory flakebot made, never into the cache
    (flakebot.deliver.publish)     itself (Nix follows links there as the user); each file is then moved in through
                                   safefs (O_EXCL temp renamed beneath the cache's descriptor; a regular file there is
                                   kept, a link at the name replaced, a link on the way refused)
    rendering and `nix eval`       flakebot's own flake.nix; evaluation reads Cargo.toml/Cargo.lock as data
    of the flake, nix build        builds (build.rs, proc macros, checks) as nixbld users in Nix's sandbox, with
                                   every nix call's options from flakebot.nix.command.machine_options
    catalog writes                 only after every check passed (stages/instruct.py)
    run ids                        names, never paths (pipeline.run.check_run_id): state.json is read only from a
                                   direct child of runs/; clean removes only paths inside the run's directory; a
                                   resume takes the sandbox mode from the current setting, not from state.json

Everything else that compiles or runs code the model touched (build scripts, proc macros, tests, the
built tool for examples and verification) runs in flakebot.sandbox with no capabilities at all (as root: an
unused uid, flakebot's own trees handed to its group), /etc only from an allow-list, and of CARGO_HOME's git/
only the run's own copy of the checkouts its Cargo.lock names.

A crafted tool run for a caller (`flakebot run`, MCP; flakebot.deliver.toolrun) sees only what the caller
names: an empty scratch directory at the caller's path and the paths its arguments name, read-only, and writes
only copies of the writable paths its caller granted beneath a grant root (flakebot.deliver.grants); a named
directory holding a socket, FIFO or device is refused like a named socket; /, home, ancestors of the working
directory, host state and paths holding a masked secret are refused; the secret masks are bound after everything
else. As root it runs as an unused uid without capabilities.

Choke points a user can rely on (every call goes through them):

    configuration provenance       flakebot.config: each setting's trust class is in its field. TRUSTED settings
                                   (sandbox, catalogs and keys, git sources, registries, every *_url, models,
                                   nix builders and nixpkgs, the directories) come only from the user's file
                                   (~/.config/flakebot/flakebot.toml), FLAKEBOT_* and flags; a working directory's
                                   flakebot.toml may only lower LIMIT settings, anything else there stops the
                                   command with one line. `config show` names each value's source.
    a tool's grants                flakebot.deliver.grants: a `--writable` path (MCP `writable`), resolved (links
                                   followed, '..' folded), must lie beneath a grant root: the directory the command
                                   or MCP server started in, the TRUSTED grant_roots setting, --grant-root on run and
                                   mcp (no MCP argument names one); an allow list, so no deny list has to name every
                                   directory a program reads. A root that is, holds or lies in a configuration
                                   directory (system trees, a home as a whole and its dot entries, the XDG bases,
                                   rustup's and cargo's homes, flakebot's own) is refused, so starting in / or $HOME
                                   grants nothing. A path on, or holding, a mount point beneath its root is refused:
                                   a mount (a bind of /etc/cron.d) is another tree under the root's spelling.
    processes flakebot starts      flakebot.launcher: jobs, supervisors, bubblewrap, pasta, nix, cargo, git,
                                   rustc, systemd-analyze... start in flakebot's own empty directory unless the
                                   caller names one it trusts (a workspace it binds, a service's state, a flake it
                                   generated), with an environment built from names (no PYTHON*, LD_* or keys
                                   unless added); a Python child is `python -I` importing flakebot from the parent's
                                   package root, so a flakebot/ package or sitecustomize.py planted in the caller's
                                   cwd, PYTHONPATH or PYTHONSTARTUP never run; tests/test_launcher.py keeps every
                                   other module from starting a process itself
    a tool's writes                flakebot.deliver.writelayer: `--writable` paths are never mounted writable; the
                                   tool writes a copy bound at every spelling of the path, and flakebot copies back
                                   regular files and directories only, nothing under a STEERING_NAMES name at any
                                   depth, nothing it changed in a directory git would take for a repository
                                   (HEAD, objects/ and refs/ side by side: git obeys the config there), through descriptors opened with O_NOFOLLOW per component (O_EXCL, rename
                                   in place), bounded by sandbox_disk_mb; a file it creates lands without exec bits
                                   (output is data); what it left out is said on one line.

A shared catalog (a binary cache others publish to; flakebot.deliver) is a mirror anyone with write access to it
controls. Its one way in is flakebot.deliver.install.read_catalog: the index's snapshot must be signed by a key the
user configured for that catalog, unexpired, well formed (flakebot.deliver.index: sizes, types, names, store
paths) and no older than what this machine saw of it (flakebot.deliver.seen, in the catalog directory: the highest
sequence and each tool's highest version), before anything reads it; a refusal is one line (exit 61), and craft
skips that catalog with a warning. The entry and closure come in by `nix copy` with only those keys and
require-sigs; flakebot checks the entry's, the tool's and every content-addressed closure path's signature itself,
and runs exactly the store path the signed index names (the signed entry and its manifest must name it too).
A catalog that fails in any way as craft tries it (its index, a fetch, nix copy, a signature, an entry's shape) is
skipped with one warning, and craft asks the next one, then crafts: a catalog someone else owns never stops a craft.
A cache's text (summaries, needs, signer names) is rendered through flakebot.modeltext, and an installed tool's
USAGE.md fences the publisher's as data.

Model text (summaries, usage, --help, example descriptions and outputs) is data wherever it is rendered:
every template and print goes through flakebot.modeltext (fenced Markdown, one-line Rust comments, escaped
rich markup, no control characters), and MCP/OpenAI descriptions mark the tool's own words as such; a model's
words inside an error line (a declined need, a refusal to choose a crate) are quoted as the model's
(modeltext.quoted). A running service's output reaches a terminal or an agent (`flakebot logs`, `-f`, MCP
service_logs, the fixes that quote a log) line by line through modeltext.others_line (no escape, bell, carriage
return or line break), its lines marked in the log apart from the supervisor's own `flakebot:` notes. A crafted
tool's stdout and stderr under `flakebot run` are the tool's own streams, passed byte-exact (a pipeline needs them
so); `--json` quotes them as JSON strings.

A service is the program its user started, not its name (flakebot.services.identity): `up` records in the
service's launch.json the store path, the binary's SHA-256, the catalog version's manifest digest and installed_from
(a shared catalog's signer), and the program it ran before. restart, up --all, rollback and the supervisor's crash
restarts run exactly that program (its binary checked against the digest first; the catalog is not read), kept
alive by the service's own GC roots (services/NAME/gcroot, previous-gcroot) whatever the catalog holds or removes;
only it is handed the service's secrets. A craft, improve, install or rm changes only the catalog (a crafted
service's result says the running one keeps its program); an agent's service_up (MCP) never upgrades a running
service nor starts one whose last launch held secrets; another program takes over only by the user's own up
NAME@VERSION, rollback or up --replace. launch.json is written exactly, not through the redactor, so a secret's
KEY (token, password, api_key) keeps its file's path.

Everything a caller can start is bounded (docs/limits.md): long MCP calls pass admission (flakebot.pipeline.jobs:
at most max_jobs on the machine and max_session_jobs per session, refused past either, nothing written); a job is
its pid plus its process start time (flakebot.processid), so a reused pid never reads as the job; tasks/result and
a detached call's start wait at most task_result_wait; outputs/ holds at most outputs_mb, least recently used files
removed first, one call's file at most output_file_mb (deliver.outputfiles); a tool run has tool_timeout, a run its
budgets. A service has one envelope (flakebot.services.envelope): its own cgroup bounds all its processes together
(sandbox_memory_mb, 512 processes; per process only where the host has no writable cgroup, logged), its state's
allocated blocks are measured against sandbox_disk_mb while it runs (past it: stopped, failed, data kept, every
start refused until under it), its log is rotated, the upgrade's copy of its state goes through safefs (no link
followed, sparse files sparse, hard links kept, data bounded by the quota, under the workdir), and its supervisor
and process are signalled only while pid and start time still match (processid.signal_if).

What a user still trusts: the kernel (namespaces, bind mounts, setpriv's capability drop, openat's O_NOFOLLOW
and renameat within one directory descriptor), the spelling of each root flakebot opens a safefs.Tree on (the
user's own cache, data and work directories, the directory a file:// catalog URL names, the parent of each grant
root; a link there is followed once, as the user wrote it), the grant roots they allow (and every program of theirs
that reads what a tool wrote beneath one), bubblewrap, Nix's build sandbox and its build users, git and cargo themselves doing
only what their hardened options allow, and the https forges on the git_sources list; for shared catalogs, the
holders of the keys configured for them (they can sign any tool, which still runs sandboxed), the first index a
machine reads of a catalog (rollback protection starts there; the expiry bounds how old it can be) and this
machine's clock; for a service, the catalog's program at the moment of the user's own up, upgrade or --replace
(what then receives its secrets), and that a store path's content does not change under Nix; their own config file and environment (flakebot reads trust settings from nowhere else). The
steering-name table cannot name every file some program reads as configuration: a tool's output with another
such name lands as data, and the user decides whether to run what reads it. A read-only named directory is
checked when the run starts: a socket a host program makes there while the tool runs is not refused.
"""

from __future__ import annotations

import os
from pathlib import Path

from flakebot.errors import NixError
from flakebot.safefs import link_leaves

# Files that steer cargo or rustup when present anywhere above the working directory: a model that
# plants them could make a host-side cargo run its program (build.rustc-wrapper) or fetch a toolchain.
STEERING_DIRS = (".cargo",)
STEERING_PREFIXES = ("rust-toolchain",)
GIT_NAME = ".git"


def steering_reason(rel: Path | str) -> str:
    """Why the workspace path `rel` is refused to writes and left out of host copies; '' when it is fine."""
    parts = Path(rel).parts
    if any(part in STEERING_DIRS for part in parts[:-1]) or (parts and parts[-1] in STEERING_DIRS):
        return f"{rel} is cargo configuration (.cargo/): it could make cargo run other programs"
    if parts and parts[-1].startswith(STEERING_PREFIXES):
        return f"{rel} is a rustup toolchain file: it could make rustup pick or download another toolchain"
    return ""


def git_reason(rel: Path | str) -> str:
    """Why `rel` is refused to the file tools and left out of copies: a `.git` part (any case: a file system that
    folds case makes .GIT the same name) would make a nested repository whose config host git obeys; '' when fine."""
    if any(part.casefold() == GIT_NAME for part in Path(rel).parts):
        return f"{rel} has a .git part: inside .git (or a gitdir: file) git obeys a config that can run programs"
    return ""


# Names a host program reads as configuration from the directory it runs in (or above it): a tool's output under
# one of them, at any depth, is never copied back to the caller's tree (flakebot.deliver.writelayer). The table
# says which program reads each; a list cannot name every such file, so the layer also copies back nothing but
# regular files and directories, and says on one line what it left out.
STEERING_NAMES = {
    "git (hooks, core.fsmonitor, filters, submodule URLs)": (".git", ".gitmodules", ".gitattributes", ".gitconfig"),
    "flakebot (its working-directory settings)": ("flakebot.toml",),
    "direnv and dotenv loaders (run or export on cd)": (".envrc", ".env", ".direnv"),
    "cargo and rustup (build.rustc-wrapper, toolchains)": (".cargo", "rust-toolchain", "rust-toolchain.toml"),
    "npm, yarn, pnpm (registries, scripts)": (".npmrc", ".yarnrc", ".yarnrc.yml", ".pnpmfile.cjs"),
    "shells": (".bashrc", ".bash_profile", ".bash_login", ".bash_logout", ".profile", ".zshrc", ".zshenv",
               ".zprofile", ".zlogin", ".zlogout", ".kshrc", ".inputrc"),
    "version managers (switch or install toolchains on cd)": (".tool-versions", ".mise.toml", "mise.toml",
                                                              ".python-version", ".nvmrc", ".node-version"),
    "other clients (hooks, credentials)": (".hg", ".hgrc", ".netrc", ".pypirc", ".ssh", ".gnupg", ".docker"),
    "editors (tasks run when a folder opens)": (".vscode", ".idea"),
}  # fmt: skip
_STEERING = {name.casefold(): reader for reader, names in STEERING_NAMES.items() for name in names}


# Characters macOS (HFS+) ignores in names and trailing characters NTFS drops: `.g\u200cit` or `.git.` is `.git`
# there (as git itself checks, is_hfs_dotgit / is_ntfs_dotgit), and the caller's directory may be on such a disk.
_IGNORED = dict.fromkeys(
    [*range(0x200B, 0x2010), *range(0x202A, 0x202F), *range(0x2060, 0x2065), *range(0x206A, 0x2070), 0xFEFF]
)


# What makes a directory a git repository to git run inside it (setup.c is_git_directory: HEAD with objects/ and
# refs/, or HEAD with a commondir file naming where they are, as a worktree's), under no name the table above lists:
# git then obeys the `config` there (core.pager runs for `git log`).
GIT_DIR_LAYOUT = ("HEAD", "objects", "refs")
GIT_DIR_READER = "git (a repository's layout: HEAD beside objects/ and refs/ or a commondir; it obeys its config)"


def git_dir_layout(names: set[str] | list[str]) -> str:
    """The program that takes a directory holding `names` for its repository (and its config as its configuration);
    '' when those names do not make one."""
    held = set(names)
    return GIT_DIR_READER if "HEAD" in held and (set(GIT_DIR_LAYOUT) <= held or "commondir" in held) else ""


def steering_name(rel: Path | str) -> str:
    """The program that would read `rel` (a path relative to a tree) as its configuration, by the first part named
    in STEERING_NAMES (any case, ignorable characters and trailing dots or spaces dropped; `.env.local` as
    `.env`); '' when no part is."""
    for part in Path(rel).parts:
        folded = part.translate(_IGNORED).rstrip(". ").casefold()
        reader = _STEERING.get(folded) or (_STEERING[".env"] if folded.startswith(".env.") else "")
        if reader:
            return reader
    return ""


def check_link(tree: Path, rel: str) -> None:
    """Refuse the symlink `tree/rel` when it points outside `tree` (or nowhere); links inside are fine. Judged by its
    text too (safefs.link_leaves): a text that climbs out and comes back in by the tree's own name resolves inside
    here, but copied as it is to another directory it names something else there."""
    link = tree / rel
    if link_leaves(tree, rel) or not Path(os.path.realpath(link)).exists():
        raise NixError(
            f"{rel} is a symbolic link to {os.readlink(link)}, outside the crate: refusing to copy it",
            fix=f"remove the link {rel} (a build script or the model made it) and package again",
            link=rel,
        )
