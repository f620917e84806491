"""The runs registry: a file per live launcher, RUNS_DIR/<launcher pid>.json, and
RUNS_DIR/latest.json, each holding the run's control address, folder and control token.
`neuronabox status` and `neuronabox inject` find runs there without being told an
address. Its own module because the launcher writes it and those commands read it, and
neither should import the other."""

from __future__ import annotations

import json
import os
import stat
import sys
import tempfile
from pathlib import Path

RUNS_DIR = Path(tempfile.gettempdir()) / "neuronabox-runs"


def why_not_ours(folder: Path) -> str | None:
    """Why `folder` may not hold this user's registry, or None: it must be a real folder
    (not a link), owned by this user, closed to everyone else. Another local user who
    made it first could otherwise read the control tokens, or plant links in it."""
    try:
        st = os.lstat(folder)
    except FileNotFoundError:
        return f"{folder} does not exist"
    if not stat.S_ISDIR(st.st_mode):
        return f"{folder} is not a folder"
    if st.st_uid != os.getuid():
        return f"{folder} belongs to uid {st.st_uid}, not this user ({os.getuid()})"
    if st.st_mode & 0o077:
        return f"{folder} is open to other users (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def register(path: Path, entry: dict) -> None:
    """A run's registry entry, readable by this user only (it holds the control token).
    The temporary file is this process's own (runs started together all write latest.json,
    and a shared temporary name lets one rename the other's away), created new: O_EXCL
    and O_NOFOLLOW, so nothing planted at its name is written through."""
    tmp = path.with_name(f"{path.stem}.{os.getpid()}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
    try:
        fd = os.open(tmp, flags, 0o600)
    except FileExistsError:  # a leftover of a dead process with this pid, or a planted link: removed, not followed
        tmp.unlink()
        fd = os.open(tmp, flags, 0o600)
    with open(fd, "w") as f:
        json.dump(entry, f)
    os.replace(tmp, path)


def enter(entry: dict) -> bool:
    """List this launcher's run: under its pid (`neuronabox status` lists every live run)
    and as the latest (the default of `neuronabox inject`). A registry folder that is not
    this user's own is not written into: the run goes on unlisted, and says so."""
    try:
        RUNS_DIR.mkdir(mode=0o700, exist_ok=True)
    except OSError as exc:
        print(f"neuronabox: warning: the run is not listed for status and inject: {exc}", file=sys.stderr)
        return False
    refused = why_not_ours(RUNS_DIR)
    if refused:
        print(f"neuronabox: warning: the run is not listed for status and inject: {refused}", file=sys.stderr)
        return False
    register(RUNS_DIR / f"{os.getpid()}.json", entry)
    register(RUNS_DIR / "latest.json", entry)
    return True


def leave() -> None:
    """Unlist this launcher's run (latest.json stays: a finished run's address answers no more)."""
    (RUNS_DIR / f"{os.getpid()}.json").unlink(missing_ok=True)
