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
import hashlib
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
    if found == lib.sha256:
        _VERIFIED.add(key)
    if found != lib.sha256:
        raise RigError(f"{lib.path} differs from the wheel's RECORD (sha256 {found}, RECORD says {lib.sha256})")


def check_built() -> None:
    for part in (RIG_DRIVER, RIG_NVML):
        if not part.is_file():
            raise RigError(f"{part} is not built; run make -C nccl_patch")


def rank_env(rank: int, pins: NcclPins, device: str = "cpu") -> dict[str, str]:
    """What a rank adds to its environment: a node of its own (NCCL_HOSTID), so NCCL connects
    every peer through its NET transport, and on the rig (device "cpu") the rig's driver first
    on the library path; on "cuda" the machine's own driver and GPU 0 (several ranks may
    share it: each is its own node to NCCL)."""
    env = {**pins.env(), "NCCL_HOSTID": f"nbx-rig-node-{rank}", "CUDA_VISIBLE_DEVICES": "0"}
    if device == "cpu":
        env.update(LD_LIBRARY_PATH=str(RIG_DIR), CUDA_MODULE_LOADING="EAGER")
    return env
