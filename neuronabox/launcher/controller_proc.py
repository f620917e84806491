"""The controller as the launcher sees it: its configuration from the Job, its process,
and the one-line cause of its end read from its log. Apart from `run` because each is a
plain function of the Job and the run's folder."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from pathlib import Path

from neuronabox.controller.config import ControllerConfig
from neuronabox.controller.net import OBSERVER_BACKLOG, listener
from neuronabox.fidelity.testbed import Placement
from neuronabox.launcher.cores import CorePlan, pin
from neuronabox.launcher.job import Job
from neuronabox.launcher.reaping import die_with_parent
from neuronabox.limits import read_tail

BUSY_POLL_S = 300e-6  # a controller on a core of its own polls this long after each pair event
# ...and goes on polling this long, Python's idle work done, so that the first frame after the
# real rank's compute finds it awake: a gap longer than this costs one wake-up (about 40 us on
# this VM), under 0.1% of it (docs/architecture.md, "The busy window").
SPIN_POLL_S = 50e-3


def busy_poll_s(cores: CorePlan | None, placement: Placement | None) -> float:
    """How long the controller's loop polls after a pair event. Polling answers a frame
    without a wake-up and keeps the loop's Python turns out of one collective's short gaps
    (at W = 2 the allreduce's best repetitions below 1 MiB went from +12% to +23% over
    all-real to -11% to +1%), but it spends its core: only for a controller with a core of
    its own, which no real rank shares (the launcher's plan `cores`, or a testbed's
    `placement` that pins every host)."""
    if cores is not None:
        return BUSY_POLL_S
    if placement is None:
        return 0.0
    ctl, nodes = placement.controller, placement.nodes.values()
    taken = {c for h in nodes for c in h.cpus or ()}
    alone = bool(ctl.cpus) and ctl.cgroup is None and all(h.cpus for h in nodes) and not taken & set(ctl.cpus)
    return BUSY_POLL_S if alone else 0.0


def controller_config(job: Job, run_dir: Path, trace: str, nccl_profile: str, member_link: str) -> ControllerConfig:
    """What the controller is told about the run (`member_link`: the head's link, if any)."""
    here = job.placement.controller if job.placement else None  # the launcher runs on the controller's host
    cluster_side = job.master_addr if job.multi_host else "127.0.0.1"  # where other hosts' ranks reach us
    return ControllerConfig(
        nnodes=job.nnodes,
        nproc_per_node=job.nproc_per_node,
        real_nodes=list(job.real_nodes),
        master_addr=job.master_addr,
        master_port=job.master_port,
        run_id=job.run_id,
        lazy=job.lazy,
        gloo_host=here.address if here else job.gloo_host,
        observer_host=here.address if here else cluster_side,
        ready_file=str(run_dir / "ready.json"),
        trace_file=trace,
        observer=job.observer,
        data=job.data,
        topology=job.topology,
        delay_model=job.delay_model,
        boundary=job.boundary,
        inject=list(job.inject),
        direct_ranks=list(job.direct_ranks),
        timeout_s=job.timeout_s,
        skew=job.skew,
        local_work=job.local_work,
        backend=job.backend,
        nccl_release=job.nccl_release,
        nccl_channels=job.nccl.channels if job.nccl else 1,
        nccl_profile=nccl_profile if job.nccl else "",
        member_link=member_link,
        busy_poll_s=(busy := busy_poll_s(job.cores, job.placement)),
        spin_poll_s=SPIN_POLL_S if busy else 0.0,
    )


def spawn(cfg: ControllerConfig, run_dir: Path, core: int | None) -> tuple[subprocess.Popen, str, str]:
    """Start the controller with `cfg`, its log in the run's folder; return it with the real
    ranks' observer port and the hello that port takes. The launcher binds the port and
    picks the secret, so the real nodes' agents can start beside the controller rather than
    after it (their environment names both; their workers start only once the controller
    plays the other agents in the store)."""
    observers = listener(cfg.observer_host, OBSERVER_BACKLOG)
    cfg.observer_fd, cfg.observer_secret = observers.fileno(), secrets.token_hex(32)
    host, port = observers.getsockname()
    config = run_dir / "controller.json"
    with open(os.open(config, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:  # it holds the secret
        f.write(cfg.dumps())
    try:
        with open(run_dir / "controller.log", "w") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "neuronabox.controller.main", str(config)],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                pass_fds=(observers.fileno(),),
                preexec_fn=die_with_parent(then=pin(core)),
            )
    finally:
        observers.close()  # the controller's copy is the one that listens
    return proc, f"{host}:{port}", cfg.observer_secret


def controller_cause(log: Path, returncode: int | None) -> str:
    """Why the controller ended, in one line: its `error:` line, a traceback's last line,
    or its exit status."""
    try:
        lines = read_tail(log, 1 << 16).decode(errors="replace").strip().splitlines()
    except OSError:
        lines = []
    errs = [ln for ln in lines if "error:" in ln]
    if errs:
        return errs[-1].split("error: ", 1)[-1]
    if lines and lines[-1][:1].isalpha() and ": " in lines[-1]:  # a traceback's last line: `pkg.Error: cause`
        kind, cause = lines[-1].split(": ", 1)
        return f"{kind.rsplit('.', 1)[-1]}: {cause}"
    if returncode is not None and returncode < 0:
        return f"the controller died (signal {-returncode})"
    return f"the controller exited with status {returncode}"
