"""What the launcher tells the controller about the run (one JSON document)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field


def real_ranks_of(real_nodes: list[int], nproc: int, direct: list[int]) -> list[int]:
    """Every rank of the whole real nodes, plus the real ranks started without an agent."""
    return sorted({n * nproc + i for n in real_nodes for i in range(nproc)} | set(direct))


@dataclass
class ControllerConfig:
    nnodes: int
    nproc_per_node: int
    real_nodes: list[int]  # nodes whose ranks all run for real, each under its own torchrun agent
    master_addr: str
    master_port: int
    run_id: str
    lazy: bool
    gloo_host: str = "127.0.0.2"
    control_host: str = "127.0.0.1"
    observer_host: str = "127.0.0.1"  # where real ranks' observers connect (a testbed's own address)
    observer_fd: int = -1  # the launcher's listener on it, inherited (-1: the controller makes its own)
    observer_secret: str = ""  # the hello the observer port takes, when the launcher chose it (the ranks' env has it)
    store_timeout_s: float = 300.0
    timeout_s: float = 1800.0  # the watchdog: a real rank without progress this long ends the run
    ready_file: str = ""
    trace_file: str = ""
    observer: bool = True
    data: str = "zeros"  # what emulated ranks contribute: zeros, or mirror (the real rank's inputs)
    topology: str = "cpu-25gbe"  # preset name or YAML file
    delay_model: str = "alpha-beta"
    boundary: str = "modeled"  # modeled: loopback, the controller adds the hop; real: the link is a cluster link
    inject: list[str] = field(default_factory=list)  # what-if modifier specs
    direct_ranks: list[int] = field(default_factory=list)  # real ranks started without an agent
    skew: str = "none"  # the emulated ranks' entry delays: none, auto, or a file of delays (ms)
    local_work: str = "measured"  # the emulated ranks' own work: measured (unless the topology gives it), topology
    backend: str = "gloo"  # the default group's: gloo, or nccl (its communicator through `nccl_comm`)
    nccl_release: str = ""  # backend nccl: the real ranks' NCCL release
    nccl_channels: int = 1  # backend nccl: the pinned channels
    nccl_profile: str = ""  # backend nccl: the FIFO the real ranks' profiler plugin writes its lines to
    busy_poll_s: float = 0.0  # after a pair event the loop polls this long (on a core of its own); 0: it sleeps
    spin_poll_s: float = 0.0  # and goes on polling this long, its idle work done (the next collective's wake-up)
    member_link: str = ""  # a run on several hosts: the head launcher's link ("host:port"), published in the store
    extra: dict = field(default_factory=dict)

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc_per_node

    @property
    def real_ranks(self) -> list[int]:
        return real_ranks_of(self.real_nodes, self.nproc_per_node, self.direct_ranks)

    def node_of(self, rank: int) -> int:
        return rank // self.nproc_per_node

    def dumps(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def loads(cls, text: str) -> ControllerConfig:
        return cls(**json.loads(text))
