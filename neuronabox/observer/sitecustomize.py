"""Loaded by every Python process a real node starts (PYTHONPATH): the one start-up
hook of a NeuronaBox run, as only one sitecustomize can be on the path. Five jobs, each
only where its variable says so: node 0's torchrun agent (no RANK yet) hosts the run's
store on the run's address only (`neuronabox.store`); every torchrun agent ends without
the interpreter's final collection (below); a real rank (RANK is set) starts
the observer; with NCCL, a real rank names its own NCCL node before NCCL loads (torchrun
gives a node's ranks one environment, and the NCCL dialect plays every rank as a node of
its own: `launcher/ranks.py`); under validate, a rank logs its optimizer steps
(`observer/steps.py`), all-real and emulated alike."""

import os

if os.environ.get("NEURONABOX_STORE_ADDR") and os.environ.get("RANK") is None:  # store.ADDR_ENV; no import to learn it
    from neuronabox.store import host_in_node0_agent

    host_in_node0_agent()  # on failure it says why and ends the agent: never the store on every interface

if os.environ.get("NEURONABOX_NCCL_HOSTID_PREFIX") and os.environ.get("RANK") is not None:
    os.environ["NCCL_HOSTID"] = os.environ["NEURONABOX_NCCL_HOSTID_PREFIX"] + os.environ["RANK"]

if os.environ.get("NEURONABOX_STEP_LOG") and os.environ.get("RANK") is not None:  # steps.STEP_LOG
    from neuronabox.observer.steps import log_steps

    log_steps(os.environ["NEURONABOX_STEP_LOG"], os.environ["RANK"])

if os.environ.get("NEURONABOX_OBSERVER") and os.environ.get("RANK") is not None:
    try:
        from neuronabox.observer.agent import start

        start()
    except Exception as exc:  # the run goes on without it
        import sys

        print(f"neuronabox observer disabled: {exc}", file=sys.stderr)

if os.environ.get("RANK") is None and __import__("sys").orig_argv[1:3] == ["-m", "torch.distributed.run"]:
    # The stock agent imports torch, and the interpreter's last collection at exit walks
    # every object of it: 0.3-0.4 s between the workers' end and the agent's, on every run.
    # Registered first, this runs last, after logging's own flush; the agent keeps nothing
    # a collection would finalize. Never in a real rank: the user's process ends as it would.
    import atexit
    import gc

    atexit.register(gc.freeze)
