"""Where `flakebot export` writes (services/exportfiles.py): an --out this machine cannot write, whatever the
reason (a read-only mount, /proc, a new directory under either), is the machine's trouble: HostError, exit 5, as
docs/exit-codes.md and `package --out` say it; nothing is left behind."""

from __future__ import annotations

from pathlib import Path

import pytest

from flakebot.errors import HostError
from flakebot.services.exportfiles import ExportDir


def test_an_out_directory_the_machine_cannot_write_is_a_host_error(read_only_dir: Path) -> None:
    for out in (read_only_dir, read_only_dir / "new" / "sub", Path("/proc/nope"), Path("/proc/nope/deeper")):
        with pytest.raises(HostError) as refused:
            ExportDir(out)
        assert refused.value.exit_code == 5 and refused.value.message.startswith(f"cannot write into {out}: ")
        assert refused.value.fix and not Path(out).exists() or out == read_only_dir
    assert list(read_only_dir.iterdir()) == []
