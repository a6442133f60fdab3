"""Services: a catalogued flake whose program runs long, supervised, health-checked, its port on 127.0.0.1.

    declaration.py ServiceSpec: the port variable and inner port, the health check, stop grace, restart policy
    catalogued.py  a service's catalog entry: its manifest (kind "service" and its spec), USAGE.md, read back
    layout.py      a service's directory under the workdir: state/, logs, launch.json, status.json, the locks
    forward.py     free host ports, the pasta command that forwards one into the service's network namespace
    handoff.py     the listening socket flakebot holds for a `socket: handoff` service: fd 3 with LISTEN_FDS and
                   LISTEN_PID, kept across restarts, handed from one supervisor to the next (upgrade, restart)
    health.py      one health check through the forward: an HTTP GET of a path, or a TCP connect
    logfile.py     the service's output as a bounded (rotated), redacted log file
    credentials.py `--secret KEY=FILE`: read-only in $CREDENTIALS_DIRECTORY, through bubblewrap, never on disk
    envelope.py    what bounds a service beyond its sandbox: its cgroup (memory, processes), its state's disk quota
    supervisor.py  the detached supervisor process: bubblewrap + its socket or pasta, checks, restarts with backoff, stop
    control.py     up, down, rollback, status, logs: what the CLI and the MCP server call
    supervised.py  start a service's supervisor on a launch and wait, stop it, its status now (control, upgrade)
    upgrade.py     `up NAME@VERSION` over a running version: checked on a copy of the state, then switched
    identity.py    the program a service is (launch.json's `program`, `previous`): what restarts run and secrets
                   reach, checked before each start and kept by the service's own GC roots, never its catalog name
    proxy.py       one HTTP request to a running service's own port (the MCP request tool), bounded
    nixos.py       `export --nixos`: the NixOS module, evaluated with nix and its unit checked by systemd-analyze
    export.py      `export NAME --nixos|--oci|--deploy-rs`: the catalog entry, then one of the three below
    oci.py         `export --oci`: the image built from the catalogued store path, read as hostile input, an OCI layout
    deployrs.py    `export --deploy-rs`: a deploy-rs node and its NixOS configuration, evaluated against stand-ins
    exportfiles.py where export writes: no link followed, nothing overwritten without --force, renamed into place
    crafting.py    `craft --service`: a service's spec (declaration + lifecycle examples), flakebot's lifecycle check
                   of the built binary, the template crate a craft starts from (flakebot/data/service-template)

May import flakebot.sandbox, flakebot.deliver, flakebot.nix (nixos.py: the nix program) and the leaves.
`package-service` (the package pipeline, then the catalog) is a command: flakebot/commands/service_verbs.py.

One supervisor process per service (flakebot's own, not a Debian supervisor such as supervisord or runit: those
run every program from one daemon's config file, cannot tell bubblewrap's own process from the service's inside
it, and know nothing of a per-start network namespace to forward into). It holds `supervisor.lock` for its whole
life, so "is it alive" is a non-blocking flock, immune to reused pids. The service runs under bubblewrap with its
own network namespace (no outbound network: its interface stays down, only its loopback exists), its own PID
namespace, `--die-with-parent`, a minimal environment plus PORT (or the spec's variable) and STATE_DIRECTORY;
its port is the listening socket the supervisor holds and hands in (handoff.py), or pasta (passt) forwards 127.0.0.1:HOSTPORT into that namespace's loopback and dies with the supervisor
(PR_SET_PDEATHSIG). A stop signals the service's own process (bubblewrap's init ignores SIGTERM), then SIGKILLs
the namespace after the grace period.
"""
