"""Prints the scheduling policies a run gave: of every thread of this rank (after Gloo
started its own) and of its launcher's controller (the launcher is the grandparent:
rank -> torchrun agent -> launcher)."""

import os
from pathlib import Path

import torch
import torch.distributed as dist


def ppid(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


dist.init_process_group("gloo")
dist.all_reduce(torch.ones(1024))
if dist.get_rank() == 0:
    threads = {os.sched_getscheduler(int(tid)) for tid in os.listdir("/proc/self/task")}
    launcher = ppid(ppid(os.getpid()))
    controllers = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            if b"neuronabox.controller.main" in cmd and ppid(int(pid)) == launcher:
                controllers.add(os.sched_getscheduler(int(pid)))
        except (OSError, IndexError):
            continue  # ended meanwhile
    print(f"POLICY threads={sorted(threads)} controller={sorted(controllers)} rr={os.SCHED_RR}", flush=True)
dist.destroy_process_group()
