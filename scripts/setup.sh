#!/usr/bin/env bash
# Idempotent set-up for a fresh machine: system packages (nix, bubblewrap, Debian's Rust crates),
# a virtualenv with flakebot installed editable, and Nix settings for this machine.
set -euo pipefail
cd "$(dirname "$0")/.."

# openssh-server: remote builders in tests/nix/test_builders.py; postgresql-15: tests/team/ start a temporary cluster;
# passt: a service's port (services/forward.py); systemd: systemd-analyze checks its NixOS unit, and runs it as PID 1;
# umoci: unpacks its OCI image in tests; podman, runc (not crun: it cannot run where cgroups are in hybrid mode),
# slirp4netns: its OCI image under a real container engine; python3: the interpreter an unprivileged user runs
# flakebot with in tests/services/test_rootless.py (a venv of it made in /tmp; pyenv's under /root is unreadable)
APT_PACKAGES=(nix-bin bubblewrap git jq openssh-server passt postgresql-15 systemd umoci podman runc slirp4netns
  python3)
# Debian's Rust crates the tests use: one list, read here and by tests/fakes/registry.py.
mapfile -t test_crates < <(sed -e 's/#.*//' -e 's/[[:space:]]*$//' -e '/^[[:space:]]*$/d' scripts/test-crates.txt)
APT_PACKAGES+=("${test_crates[@]}")
# scripts/bench-setup.sh adds the benchmark's crate corpus (make bench), not needed by make test.
read -r -a extra <<< "${BENCH_APT_PACKAGES:-}"
APT_PACKAGES+=("${extra[@]}")

missing=()
for pkg in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  echo "setup: installing ${missing[*]}"
  $sudo_cmd apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -q "${missing[@]}" >/dev/null
fi

# Nix as root with no daemon: builds run as the unprivileged nixbld users (never as root, which would let a
# build script write into /usr or the toolchain). Debian's nix-bin creates them; create what is missing as Nix's
# multi-user installer does, and undo the empty build-users-group an earlier version of this script wrote.
if [ "$(id -u)" -eq 0 ]; then
  getent group nixbld >/dev/null || groupadd --system nixbld
  for n in $(seq 1 10); do
    if ! getent passwd "nixbld$n" >/dev/null; then
      useradd --system --no-create-home --home-dir /var/empty --shell "$(command -v nologin || echo /bin/false)" \
        --gid nixbld --groups nixbld --comment "Nix build user $n" "nixbld$n"
    fi
    # Nix takes its build users from the group's member list (a primary group alone is not in it)
    getent group nixbld | cut -d: -f4 | tr , '\n' | grep -qx "nixbld$n" || usermod --append --groups nixbld "nixbld$n"
  done
  if [ -f /etc/nix/nix.conf ] && grep -q '^build-users-group *= *$' /etc/nix/nix.conf; then
    sed -i 's/^build-users-group *= *$/build-users-group = nixbld/' /etc/nix/nix.conf
  fi
fi

if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
stamp=.venv/.flakebot-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  log=.venv/pip-install.log
  if ! { .venv/bin/pip install -q --upgrade pip && .venv/bin/pip install -q -e '.[test]'; } > "$log" 2>&1; then
    tail -n 30 "$log"
    echo "setup: pip install failed (full log: $log)" >&2
    exit 1
  fi
  touch "$stamp"
fi
# The official MCP TypeScript SDK, for tests/test_mcp.py's second, independent client (node over stdio).
# Its test is skipped, saying why, when npm cannot reach its registry.
if command -v npm >/dev/null && [ ! -d tests/mcp_ts/node_modules/@modelcontextprotocol/sdk ]; then
  if ! (cd tests/mcp_ts && npm ci --no-audit --no-fund --silent) > .venv/npm-install.log 2>&1; then
    echo "setup: npm could not install the MCP TypeScript SDK (log: .venv/npm-install.log); its client test will be skipped"
  fi
fi
# langchain-mcp-adapters, for tests/test_mcp_agents.py's LangChain client, in a venv of its own (it needs mcp<2).
# Its test is skipped, saying why, when pip cannot install it.
lc=.venv/langchain
if [ ! -f "$lc/.installed" ] || [ tests/mcp_langchain/requirements.txt -nt "$lc/.installed" ]; then
  if { [ -x "$lc/bin/python" ] || python3 -m venv "$lc"; } \
    && "$lc/bin/pip" install -q -r tests/mcp_langchain/requirements.txt > .venv/langchain-install.log 2>&1; then
    touch "$lc/.installed"
  else
    echo "setup: could not install langchain-mcp-adapters (log: .venv/langchain-install.log); its client test will be skipped"
  fi
fi
echo "setup: ready (.venv/bin/flakebot)"
