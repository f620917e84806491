"""The real ranks' commands and environments, from the Job: the stock torchrun each real
node runs, and, for real ranks started without an agent, the worker command and the
environment torchrun's agent would give them. Apart from `run` because they are plain
functions of the Job (no process is started here)."""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path

from neuronabox import store
from neuronabox.launcher.job import Job
from neuronabox.launcher.nccl_rig import HOSTID_PREFIX, rig_env
from neuronabox.launcher.reaping import RUN_MARK
from neuronabox.launcher.torchrun_args import without_pet

# Where the real nodes' one start-up hook is (sitecustomize: node 0's store, the observer).
SITE_DIR = Path(__file__).resolve().parents[1] / "observer"


def ranks_env(
    job: Job, observer_addr: str, observer_secret: str = "", mark: str = "", nccl_profile: str = ""
) -> dict[str, str]:
    """The environment of every real rank's process (torchrun's, or a direct rank's base).
    `mark` is the run's: whatever these processes start inherits it, which is how the
    launcher finds their daemons at the end (`reaping.stop_marked`). `nccl_profile`: the
    FIFO the controller reads the profiler plugin's lines from (backend nccl)."""
    env = without_pet(os.environ)  # read into the Job; torchrun would take them over our flags
    if mark:
        env[RUN_MARK] = mark
    if not job.multi_host:  # one host: every rank and the controller on loopback
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    env["NEURONABOX_REAL_RANKS"] = ",".join(map(str, job.real_ranks))
    env["NEURONABOX_WORLD_SIZE"] = str(job.world_size)
    if job.lazy:
        env["TORCH_GLOO_LAZY_INIT"] = "1"
    else:
        env.pop("TORCH_GLOO_LAZY_INIT", None)
    if job.observer:
        env["NEURONABOX_OBSERVER"] = observer_addr
        env["NEURONABOX_OBSERVER_SECRET"] = observer_secret  # the hello the controller's observer port takes
        env["NEURONABOX_DATA"] = job.data
        # The observer reads recent entries only; a dump of 64 costs ~0.5 ms, of 1024 ~18 ms.
        env.setdefault("TORCH_FR_BUFFER_SIZE", "64")
    if 0 in job.local_nodes:  # node 0's torchrun hosts the store: on the run's address only
        env.update(store.agent_env(job.master_addr, job.master_port))
    if job.nccl is not None:
        env.update(nccl_env(job, nccl_profile, env.get("LD_LIBRARY_PATH")))
    if job.observer or 0 in job.local_nodes or job.nccl is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SITE_DIR), env.get("PYTHONPATH")]))
    return env


def nccl_env(job: Job, profile: str, inherited_libs: str | None) -> dict[str, str]:
    """Backend nccl: the pins (docs/nccl_wire.md), the profiler's start lines to `profile`, a
    node of its own for each rank (sitecustomize sets NCCL_HOSTID from RANK: torchrun gives
    a node's ranks one environment), and on the rig its driver first on the library path."""
    assert job.nccl is not None
    env = dataclasses.replace(job.nccl, trace=profile).env()
    env.update(NEURONABOX_NCCL_TRACE_START="1", NEURONABOX_NCCL_HOSTID_PREFIX=HOSTID_PREFIX)
    if job.nccl_device == "cpu":
        env.update(rig_env(inherited_libs), CUDA_VISIBLE_DEVICES="0")
    return env


def node_log_dir(job: Job, env: dict[str, str], folder: Path) -> Path | None:
    """Where a real node's torchrun keeps its logs: `folder` (the run's, removed when the run
    ends well), unless the user said where (--log-dir, or PET_LOG_DIR, which torchrun reads).
    torchrun's own default is a fresh /tmp/torchelastic_* folder a run that nothing removes
    (a day of benchmarks here left 2,000)."""
    if "PET_LOG_DIR" in env or any(f == "--log-dir" for f, _ in job.torchrun_flags):
        return None
    return folder / "torchelastic"


def node_command(job: Job, node: int, log_dir: Path | None = None) -> list[str]:
    """The stock torchrun of a real node, on the job's static rendezvous; `log_dir` its
    --log-dir (`node_log_dir`), if any."""
    passthrough = [f"{f}={v}" if v is not None else f for f, v in job.torchrun_flags]
    if log_dir is not None:
        passthrough.append(f"--log-dir={log_dir}")
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nnodes={job.nnodes}",
        f"--nproc-per-node={job.nproc_per_node}",
        f"--node-rank={node}",  # before the script: node 0's is `store.NODE0`
        f"--master-addr={job.master_addr}",
        f"--master-port={job.master_port}",
        "--rdzv-backend=static",
        f"--rdzv-id={job.run_id}",
        *passthrough,
        *job.script,
    ]


def worker_command(job: Job) -> list[str]:
    """The worker command torchrun would run: `python script args`, `python -m mod
    args`, or the program itself with --no-python."""
    if job.runs_as == "program":
        return list(job.script)
    if job.runs_as == "module":
        return [sys.executable, "-m", *job.script]
    return [sys.executable, "-u", *job.script]


def direct_env(job: Job, base: dict[str, str], rank: int) -> dict[str, str]:
    """What torchrun's agent sets for a worker; the store is the controller's."""
    node, local = divmod(rank, job.nproc_per_node)
    env = dict(base)
    env.update(
        RANK=str(rank),
        LOCAL_RANK=str(local),
        GROUP_RANK=str(node),
        ROLE_RANK=str(rank),
        ROLE_NAME="default",
        LOCAL_WORLD_SIZE=str(job.nproc_per_node),
        WORLD_SIZE=str(job.world_size),
        GROUP_WORLD_SIZE=str(job.nnodes),
        ROLE_WORLD_SIZE=str(job.world_size),
        MASTER_ADDR=job.master_addr,
        MASTER_PORT=str(job.master_port),
        TORCHELASTIC_RESTART_COUNT="0",
        TORCHELASTIC_MAX_RESTARTS="0",
        TORCHELASTIC_RUN_ID=job.run_id,
        TORCHELASTIC_USE_AGENT_STORE="True",
        OMP_NUM_THREADS=base.get("OMP_NUM_THREADS", "1"),
    )
    return env
