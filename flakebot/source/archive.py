"""A crate's published `.crate` archive: downloaded checksum-verified by the crates.io client, extracted safely."""

from __future__ import annotations

import logging
import tarfile
import tempfile
import zlib
from pathlib import Path
from urllib.parse import quote

from flakebot.config import Settings
from flakebot.crates import CrateInfo
from flakebot.errors import AcquireError

logger = logging.getLogger(__name__)


def archive_url(crate: CrateInfo, settings: Settings) -> str:
    name, version = quote(crate.name), quote(crate.version)
    return f"{settings.cratesio_static_url.rstrip('/')}/crates/{name}/{name}-{version}.crate"


def fetch_into(crate: CrateInfo, dest: Path, settings: Settings) -> str:
    """Download, verify and unpack the crate's .crate into the empty directory `dest` (registry files included); returns its URL."""
    if settings.offline:
        raise AcquireError(
            "its .crate archive cannot be downloaded offline",
            fix="use a crate from the local registry, or drop --offline",
        )
    from flakebot.crates.cratesio import CratesIo  # only archive acquisitions need the crates.io client

    with tempfile.TemporaryDirectory(dir=dest.parent, prefix=".crate-download-") as scratch:
        # download() refuses the file unless its sha256 matches (the given one, else the index's).
        archive = CratesIo(settings).download(crate.name, crate.version, Path(scratch), checksum=crate.checksum or None)
        extract(archive, dest, f"{crate.name}-{crate.version}")
    return archive_url(crate, settings)


def extract(archive: Path, dest: Path, top: str) -> None:
    """Unpack a .crate (a gzipped tar whose entries all sit under `top`/) so its files land directly in `dest`."""
    try:
        with tarfile.open(archive, "r:gz") as tar:
            strays = [m.name for m in tar.getmembers() if m.name != top and not m.name.startswith(f"{top}/")]
            if strays:
                raise AcquireError(
                    f"the .crate archive has entries outside {top}/ (e.g. {strays[0]})",
                    fix="the archive is not a cargo package; report it",
                )
            tar.extractall(dest, filter="data")  # refuses absolute paths, '..', device files and links leaving dest
    except (tarfile.TarError, EOFError, zlib.error) as exc:
        raise AcquireError(
            f"the .crate archive is corrupt ({exc})", fix="retry; the download may have been cut short"
        ) from None
    unpacked = dest / top
    for child in list(unpacked.iterdir()):
        child.rename(dest / child.name)
    unpacked.rmdir()
