"""The NCCL rig: the wheel's unmodified libnccl on this machine's CPU.

NCCL's host code (bootstrap, topology, connection setup, proxy thread, Socket net) is
real; the CUDA driver it loads (`nccl_patch/build/rig/libcuda.so.1`) and the NVML it
asks about its GPU (`libnvidia-ml.so.1`) are the rig's own, and NCCL's device kernels
run as CPU code inside that driver (docs/nccl_rig.md). This module finds the pieces,
checks that the library is the wheel's file byte for byte, and builds a rig rank's
environment on top of the launcher's pins.
"""

from __future__ import annotations

import base64
import ctypes
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from neuronabox.errors import NeuronaBoxError
from neuronabox.launcher.nccl_pins import NcclPins

RIG_DIR = Path(__file__).resolve().parents[2] / "nccl_patch" / "build" / "rig"
RIG_DRIVER = RIG_DIR / "libcuda.so.1"
RIG_NVML = RIG_DIR / "libnvidia-ml.so.1"
WHEELS = ("nvidia-nccl-cu12", "nvidia-nccl-cu13")  # the dev extra's; a CUDA 13 torch's


class RigError(NeuronaBoxError):
    """The rig cannot run here (not built, or the wheel's library is missing or changed)."""


@dataclass(frozen=True)
class WheelLibrary:
    path: Path
    sha256: str  # as the wheel's RECORD writes it: urlsafe base64, no padding
    size: int


def wheel_library() -> WheelLibrary:
    """The wheel's libnccl.so.2 and the hash its RECORD holds for it."""
    import importlib.metadata as metadata

    for wheel in WHEELS:
        try:
            dist = metadata.distribution(wheel)
        except metadata.PackageNotFoundError:
            continue
        for entry in dist.files or ():
            if entry.name == "libnccl.so.2" and entry.hash is not None:
                return WheelLibrary(Path(entry.locate()), entry.hash.value, int(entry.size or 0))
        raise RigError(f"the {wheel} wheel's RECORD lists no libnccl.so.2")
    raise RigError(f"the rig needs the {WHEELS[0]} wheel (pip install -e '.[dev]')")


def record_hash(path: Path) -> str:
    """A file's sha256 in the RECORD's spelling."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    return base64.urlsafe_b64encode(digest.digest()).rstrip(b"=").decode()


_VERIFIED: set[tuple] = set()  # (path, size, mtime, inode) already hashed by this process


def verify_unmodified(lib: WheelLibrary) -> None:
    """Refuse a libnccl that is not, byte for byte, the one the wheel shipped. A file once
    hashed by this process is not hashed again while its size, time and inode stay (400 MB
    take a second to hash)."""
    if not lib.path.is_file():
        raise RigError(f"{lib.path} is missing")
    st = lib.path.stat()
    key = (str(lib.path), st.st_size, st.st_mtime_ns, st.st_ino, lib.sha256)
    if key in _VERIFIED:
        return
    found = record_hash(lib.path)
    if found != lib.sha256:
        raise RigError(f"{lib.path} differs from the wheel's RECORD (sha256 {found}, RECORD says {lib.sha256})")
    _VERIFIED.add(key)


def check_built() -> None:
    for part in (RIG_DRIVER, RIG_NVML):
        if not part.is_file():
            raise RigError(f"{part} is not built; run make -C nccl_patch")


def library(device: str = "cpu") -> Path:
    """The libnccl the ranks load: the wheel's, checked byte for byte against its RECORD, or
    NEURONABOX_NCCL_LIBRARY (another build, not checked). On the rig (device "cpu") the
    rig's driver must be built too."""
    if device == "cpu":
        check_built()
    override = os.environ.get("NEURONABOX_NCCL_LIBRARY")
    if override:
        if not Path(override).is_file():
            raise RigError(f"NEURONABOX_NCCL_LIBRARY={override} is not a file")
        return Path(override)
    lib = wheel_library()
    verify_unmodified(lib)
    return lib.path


def library_version(path: Path) -> str:
    """The release a libnccl reports (ncclGetVersion needs no driver)."""
    lib = ctypes.CDLL(str(path))
    code = ctypes.c_int()
    if lib.ncclGetVersion(ctypes.byref(code)) != 0:
        raise RigError(f"{path}: ncclGetVersion failed")
    v = code.value
    return f"{v // 10000}.{v // 100 % 100}.{v % 100}"


HOSTID_PREFIX = "nbx-rig-node-"  # NCCL_HOSTID = this + the rank: every rank a node of its own


def rank_env(rank: int, pins: NcclPins, device: str = "cpu") -> dict[str, str]:
    """What a rank adds to its environment: a node of its own (NCCL_HOSTID), so NCCL connects
    every peer through its NET transport, and on the rig (device "cpu") the rig's driver first
    on the library path; on "cuda" the machine's own driver and GPU 0 (several ranks may
    share it: each is its own node to NCCL)."""
    env = {**pins.env(), "NCCL_HOSTID": f"{HOSTID_PREFIX}{rank}", "CUDA_VISIBLE_DEVICES": "0"}
    if device == "cpu":
        env.update(rig_env())
    return env


def rig_env(inherited: str | None = None) -> dict[str, str]:
    """The rig's driver first on the library path (before `inherited`), modules loaded eagerly."""
    return {"LD_LIBRARY_PATH": ":".join(p for p in (str(RIG_DIR), inherited) if p), "CUDA_MODULE_LOADING": "EAGER"}
