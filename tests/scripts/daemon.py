"""A rank 0 that starts a daemon the classic way (fork, setsid, fork again: the daemon
is no longer in the rank's process tree), which listens on a socket, writes its pid to
--pid-file and sleeps; then the job ends normally."""

import argparse
import os
import socket
import sys
import time


def daemonize(pid_file: str) -> None:
    child = os.fork()
    if child:
        os.waitpid(child, 0)
        return
    os.setsid()
    if os.fork():
        os._exit(0)
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    with open(pid_file + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.rename(pid_file + ".tmp", pid_file)
    time.sleep(600)
    os._exit(0)


p = argparse.ArgumentParser()
p.add_argument("--pid-file", required=True)
args = p.parse_args()
if os.environ.get("RANK") == "0":
    daemonize(args.pid_file)  # before torch starts threads, which a fork does not take along
    while not os.path.exists(args.pid_file):
        time.sleep(0.01)

import torch.distributed as dist  # noqa: E402

dist.init_process_group("gloo")
dist.barrier()
sys.stdout.flush()
os._exit(0)  # no interpreter teardown: stock torch may abort in it
