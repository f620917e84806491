"""A rank 0 that starts a daemon the classic way (fork, setsid, fork again: the daemon
is no longer in the rank's process tree), which listens on a socket, writes its pid to
--pid-file and sleeps; then the job ends normally."""

import argparse
import os
import socket
import sys
import time


def daemonize(pid_file: str) -> None:
    """Returns once the daemon listens and has written its pid (it says so on a pipe)."""
    ready_r, ready_w = os.pipe()
    child = os.fork()
    if child:
        os.close(ready_w)
        os.waitpid(child, 0)
        os.read(ready_r, 1)  # the daemon's word, or EOF if it died first
        os.close(ready_r)
        return
    os.close(ready_r)
    os.setsid()
    if os.fork():
        os._exit(0)
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    with open(pid_file + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.rename(pid_file + ".tmp", pid_file)
    os.write(ready_w, b"x")
    os.close(ready_w)
    time.sleep(600)  # its life: until the run's sweep stops it
    os._exit(0)


p = argparse.ArgumentParser()
p.add_argument("--pid-file", required=True)
args = p.parse_args()
if os.environ.get("RANK") == "0":
    daemonize(args.pid_file)  # before torch starts threads, which a fork does not take along

import torch.distributed as dist  # noqa: E402

dist.init_process_group("gloo")
dist.barrier()
sys.stdout.flush()
os._exit(0)  # no interpreter teardown: stock torch may abort in it
