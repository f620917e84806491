"""The runs registry: a file per live launcher, RUNS_DIR/<launcher pid>.json, and
RUNS_DIR/latest.json, each holding the run's control address, folder and control token.
`neuronabox status` and `neuronabox inject` find runs there without being told an
address. Its own module because the launcher writes it and those commands read it, and
neither should import the other."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

RUNS_DIR = Path(tempfile.gettempdir()) / "neuronabox-runs"


def register(path: Path, entry: dict) -> None:
    """A run's registry entry, readable by this user only (it holds the control token).
    The temporary file is this process's own: runs started together all write
    latest.json, and a shared temporary name lets one rename the other's away."""
    tmp = path.with_name(f"{path.stem}.{os.getpid()}.tmp")
    with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
        json.dump(entry, f)
    os.replace(tmp, path)


def enter(entry: dict) -> None:
    """List this launcher's run: under its pid (`neuronabox status` lists every live run)
    and as the latest (the default of `neuronabox inject`)."""
    RUNS_DIR.mkdir(mode=0o700, exist_ok=True)
    register(RUNS_DIR / f"{os.getpid()}.json", entry)
    register(RUNS_DIR / "latest.json", entry)


def leave() -> None:
    """Unlist this launcher's run (latest.json stays: a finished run's address answers no more)."""
    (RUNS_DIR / f"{os.getpid()}.json").unlink(missing_ok=True)
