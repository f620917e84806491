"""The default process group's NCCL communicator under `neuronabox torchrun --backend nccl`.

ProcessGroupNCCL makes its first communicator at the default group's first NCCL call
(or at init, given `device_id`): real rank 0 calls ncclGetUniqueId and sets the 128 bytes
under key "0" of the group's store, and every other rank gets them there
(`broadcastUniqueNCCLID`, torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp). On the run's
store that key is `UID_KEY`: torch's PrefixStore chain adds "default_pg", the group's
name "0" and the device "cuda". The launcher pins TORCH_NCCL_RANKS_PER_ROOT to at least
the world, so torch keeps one root (no `ncclCommInitRankScalable`).

`TorchNcclComm` plays the emulated ranks' side of that exchange (it reads real rank 0's
id, or sets its own when rank 0 is emulated) and then serves the communicator
(`dialects/nccl/live.py`) in a thread of its own. The controller's Gloo loop keeps the
store, the emulated agents and the status service; finished collectives go to the run's
recorder through `on_record`.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

from neuronabox.schedules.nccl import DEFAULT_BUFFSIZE, NcclConfig

from .config import ControllerConfig
from .dialects.nccl.live import NcclLive
from .dialects.nccl.relay import Instance, NcclRelay
from .dialects.nccl.sockets import open_profile_fifo
from .dialects.nccl.versions import layout_for
from .dialects.nccl.wire import UniqueId
from .lifecycle import RanksBlocked
from .outcomes import InstanceRecord
from .release import ReleaseTiming
from .rendezvous import group_key

UID_KEY = "default_pg/0//cuda//0"  # the default group's first NCCL communicator's id on the run's store
UID_POLL_S = 0.05  # how often the store is asked for real rank 0's id (a stop is seen as soon)
GLOO_POLL_S = 0.2  # how often the store is asked whether a real rank made a Gloo default group instead
SILENCE_S = 30.0  # how long a real rank's bytes may wait for their collective's profiler line
JOIN_S = 5.0  # how long a stop waits for the communicator's thread


def record_of(inst: Instance, order: int, world: int) -> InstanceRecord:
    """A finished NCCL collective as the run's trace keeps every instance."""
    p = inst.params
    start = min(inst.entered.values(), default=inst.created)
    end = max([start, *inst.left.values()])
    per_rank = {r: (t, max(t, inst.left.get(r, t))) for r, t in inst.entered.items()}
    numel = p.total_count(world)
    return InstanceRecord(
        group="0", tag=order, kind=str(p.kind), nbytes=numel * p.elem,
        boundary_messages=inst.boundary_messages, start=start, end=end, per_rank=per_rank,
        geometry=f"nccl {p.algo}/{p.proto} {p.channels}ch", loop_cpu=time.process_time(), predicted=inst.predicted,
        world=world, root=p.root if p.kind == "broadcast" else None, numel=numel,
        elem=p.elem, dtype=p.dtype,
    )  # fmt: skip


class TorchNcclComm:
    """The emulated ranks of the default group's NCCL communicator. `on_record`: a finished
    collective (from this component's thread); `fail`: its error, which ends the run."""

    def __init__(
        self,
        cfg: ControllerConfig,
        timing: ReleaseTiming,
        on_record: Callable[[InstanceRecord], None],
        fail: Callable[[BaseException], None],
        log: Callable[[str], None],
        host: str = "127.0.0.1",
    ) -> None:
        layout = layout_for(cfg.nccl_release)
        self.world, self.real = cfg.world_size, cfg.real_ranks
        config = NcclConfig(buffsize=DEFAULT_BUFFSIZE, channels=cfg.nccl_channels,
                            min_traffic_per_channel=layout.min_traffic_per_channel)  # fmt: skip
        # The profiler names no reduction: the emulated ranks add sum's identity (zeros).
        self.relay = NcclRelay(self.world, self.real, config, timing, redop="sum")
        self.on_record, self.fail, self.log = on_record, fail, log
        self.fifo = open_profile_fifo(cfg.nccl_profile)  # before the ranks start: their plugin opens it
        self.live = NcclLive(layout, self.world, self.real, self.relay, self.fifo[0], host=host,
                             on_instance=self._finished, silence_s=SILENCE_S)  # fmt: skip
        self.thread: threading.Thread | None = None

    def start(self, store) -> None:
        """The run's store is open and the agents joined (a store thread): exchange the id
        and serve, in a thread of this component's own."""
        self.thread = threading.Thread(target=self._serve, args=(store,), name="nccl", daemon=True)
        self.thread.start()
        threading.Thread(target=self._refuse_gloo, args=(store,), name="nccl-gloo-guard", daemon=True).start()

    def close(self) -> None:
        """Stop the loop, wait for its thread, and close the sockets and the FIFO."""
        self.live.stop()
        if self.thread is not None:
            self.thread.join(JOIN_S)
        self.live.close()
        for fd in self.fifo:
            try:
                os.close(fd)
            except OSError:
                pass

    def _serve(self, store) -> None:
        try:
            if 0 in self.real:
                uid = self._await_uid(store)
                if uid is None:
                    return
                self.live.join(uid)
                self.log("NCCL: real rank 0's unique id read from the store; emulated ranks checked in")
            else:
                store.set(UID_KEY, self.live.unique_id)
                self.log("NCCL: the controller is the root; its unique id is in the store")
            self.live.run()
        except BaseException as exc:  # noqa: BLE001
            if not self.live.stopped:
                self.fail(exc)

    def _await_uid(self, store) -> UniqueId | None:
        """Real rank 0's id, once its ProcessGroupNCCL set it (None: stopped first)."""
        while not self.live.stopped:
            if store.check([UID_KEY]):
                return UniqueId.decode(bytes(store.get(UID_KEY)))
            time.sleep(UID_POLL_S)
        return None

    def _refuse_gloo(self, store) -> None:
        """A script that makes its default group with Gloo under --backend nccl waits for
        emulated Gloo peers that nobody plays: end the run naming that, until the first
        NCCL collective shows the script is NCCL's."""
        keys = {r: group_key("0", r) for r in self.real}
        try:
            while not self.live.stopped and self.live.collectives == 0:
                for r, key in keys.items():
                    if store.check([key]):
                        self.log(f"NCCL: real rank {r}'s Gloo record is in the store")
                        raise RanksBlocked(
                            f"real rank {r} made its default process group with Gloo, but the run is "
                            "--backend nccl (the emulated ranks play NCCL): init the group with 'nccl', "
                            "or drop --backend nccl"
                        )
                time.sleep(GLOO_POLL_S)
        except BaseException as exc:  # noqa: BLE001
            if not self.live.stopped:
                self.fail(exc)

    def _finished(self, inst: Instance, order: int) -> None:
        self.on_record(record_of(inst, order, self.world))
