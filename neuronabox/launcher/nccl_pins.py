"""What `neuronabox torchrun --backend nccl` pins in the real ranks' NCCL, and the
checks that refuse a setup the NCCL dialect does not speak, before anything starts.

The controller re-derives what the real rank's NCCL decides (algorithm, protocol,
channels, transport, one bootstrap root), so those choices must not be left to
NCCL's tuner or to the machine; `NcclPins.env` groups the pins by why (docs/nccl_wire.md).
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from neuronabox.errors import NeuronaBoxError

ALGORITHMS = {"ring": "Ring", "tree": "Tree"}
ROUTES = ("socket", "plugin")
PLUGIN_DIR = Path(__file__).resolve().parents[2] / "nccl_patch" / "build"
NET_PLUGIN = PLUGIN_DIR / "libnccl-net-neuronabox.so"
PROFILER_PLUGIN = PLUGIN_DIR / "libnccl-profiler-neuronabox.so"

# The values of NCCL's own choice variables that the dialect speaks (a pin may still pick one of them).
SPOKEN_CHOICES: dict[str, tuple[str, ...]] = {"NCCL_ALGO": ("Ring", "Tree"), "NCCL_PROTO": ("Simple",)}
FLAG_OF = {"NCCL_ALGO": "--nccl-algo", "NCCL_NET": "--nccl-route", "NCCL_MIN_NCHANNELS": "--nccl-channels",
           "NCCL_MAX_NCHANNELS": "--nccl-channels"}  # fmt: skip
REFUSED = {"NCCL_COMM_ID": "it moves the bootstrap root out of the real rank"}
FREE = {"NCCL_PROFILER_PLUGIN", "NEURONABOX_NCCL_TRACE"}  # the user's own profiler is theirs to load


class NcclSetupError(NeuronaBoxError):
    """A real rank's NCCL setup the dialect does not speak: refused before the run."""


@dataclass(frozen=True)
class NcclPins:
    """The real ranks' NCCL environment for an emulated world of `world` ranks."""

    world: int
    algo: str = "ring"
    channels: int = 1
    route: str = "socket"
    trace: str = ""  # where the profiler plugin appends its records ("": no profiler)

    def __post_init__(self) -> None:
        if self.algo not in ALGORITHMS:
            raise NcclSetupError(f"--nccl-algo is {' or '.join(ALGORITHMS)}, got {self.algo!r}")
        if self.route not in ROUTES:
            raise NcclSetupError(f"--nccl-route is {' or '.join(ROUTES)}, got {self.route!r}")
        if not 1 <= self.channels <= 64:
            raise NcclSetupError(f"--nccl-channels is 1 to 64, got {self.channels}")
        if self.algo == "tree" and self.channels > 1:  # which channel runs which tree is the real rank's search's
            raise NcclSetupError("--nccl-algo tree runs on one channel until the tree of each channel is read "
                                 "from a real rank; drop --nccl-channels")  # fmt: skip

    def env(self) -> dict[str, str]:
        k = str(self.channels)
        env = {
            # the transport: NCCL's Socket net over loopback, one connection per peer
            "NCCL_NET": "Socket" if self.route == "socket" else "NeuronaBox",
            "NCCL_NET_PLUGIN": "none" if self.route == "socket" else str(NET_PLUGIN),
            "NCCL_IB_DISABLE": "1",
            "NCCL_SOCKET_IFNAME": "lo",
            "NCCL_SOCKET_FAMILY": "AF_INET",
            "NCCL_SOCKET_NTHREADS": "0",
            # the schedule: one algorithm, Simple (no LL flags to forge), pinned channels
            "NCCL_ALGO": ALGORITHMS[self.algo],
            "NCCL_PROTO": "Simple",
            "NCCL_MIN_NCHANNELS": k,
            "NCCL_MAX_NCHANNELS": k,
            "NCCL_BUFFSIZE": str(4 << 20),
            "NCCL_NTHREADS": "512",
            # connect only what the algorithm uses, when it is first used
            "NCCL_RUNTIME_CONNECT": "1",
            "NCCL_CUMEM_ENABLE": "1",
            "NCCL_LOCAL_REGISTER": "0",
            "NCCL_GRAPH_REGISTER": "0",
            # no path the controller does not play
            "NCCL_NVLS_ENABLE": "0",
            "NCCL_COLLNET_ENABLE": "0",
            "NCCL_MNNVL_ENABLE": "0",
            "NCCL_PAT_ENABLE": "0",
            "NCCL_P2P_DISABLE": "1",
            "NCCL_SHM_DISABLE": "1",
            "NCCL_RAS_ENABLE": "0",
            "NCCL_ALLGATHERV_ENABLE": "0",
            "NCCL_WIN_ENABLE": "0",
            "NCCL_OOB_NET_ENABLE": "0",
            "NCCL_TUNER_PLUGIN": "none",
            "NCCL_PROFILER_PLUGIN": str(PROFILER_PLUGIN) if self.trace else "none",
            # a single bootstrap root whatever the world (PyTorch splits above 128 ranks)
            "TORCH_NCCL_RANKS_PER_ROOT": str(max(self.world, 128)),
        }
        if self.trace:
            env["NEURONABOX_NCCL_TRACE"] = self.trace
        return env

    def summary(self) -> str:
        """The one line the launcher prints: what it pinned."""
        net = "NCCL's Socket net" if self.route == "socket" else f"the net plugin {NET_PLUGIN.name}"
        return (
            f"NCCL pinned: {net} on lo, {ALGORITHMS[self.algo]}/Simple, {self.channels} channel(s), "
            f"NVLS/CollNet/PAT off, one bootstrap root (TORCH_NCCL_RANKS_PER_ROOT={max(self.world, 128)})"
        )


def check_user_env(env: Mapping[str, str], pins: NcclPins) -> None:
    """Refuse, naming it, a variable the user set that contradicts a pin: the controller
    re-derives NCCL's choices from the pins, so a different value would desynchronise it."""
    for var, value in env.items():
        if var in REFUSED:
            raise NcclSetupError(f"{var}={value} is not spoken by the NCCL dialect ({REFUSED[var]}); unset it")
    pinned = pins.env()
    for var, want in pinned.items():
        value = env.get(var)
        if value is None or value == want or var in FREE:
            continue
        if var == "TORCH_NCCL_RANKS_PER_ROOT" and value.isdigit() and int(value) >= pins.world:
            continue  # still one root for the whole world
        spoken = SPOKEN_CHOICES.get(var)
        if spoken is not None and value not in spoken:
            allowed = ", ".join(spoken)
            raise NcclSetupError(f"{var}={value} is not spoken by the NCCL dialect (spoken: {allowed}); unset it")
        how = f"use {FLAG_OF[var]} instead" if var in FLAG_OF else "unset it"
        raise NcclSetupError(f"{var}={value} contradicts the launcher's pin {var}={want}; {how}")


_PROBE = """
import torch
if not torch.cuda.is_available() or not torch.distributed.is_nccl_available():
    print("none", torch.__version__)
else:
    v = torch.cuda.nccl.version()
    print(".".join(map(str, v)) if isinstance(v, tuple) else v, torch.__version__)  # old torch: NCCL's int code
"""


def probe_nccl(python: str, env: Mapping[str, str], timeout: float = 60.0) -> str:
    """The NCCL version the real ranks' torch carries; refused, in one line, where there is none."""
    try:
        out = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True, env=dict(env), timeout=timeout)
    except subprocess.TimeoutExpired:
        raise NcclSetupError(f"asking {python}'s torch for its NCCL took over {timeout:.0f} s") from None
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["no output"])[-1]
        raise NcclSetupError(f"cannot ask torch for its NCCL: {last}")
    found, torch_version = (out.stdout.split() + ["", ""])[:2]
    if found == "none":
        raise NcclSetupError(
            f"--backend nccl needs a CUDA build of torch on a GPU machine; this torch ({torch_version}) has no NCCL"
        )
    return found
