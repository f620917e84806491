"""A run from the host of one real node among several (`--node-rank K`, the controller
on another host): find the head through the run's store, join it (`hosts.MemberLink`),
run this node's stock torchrun, and end when the node does or the head says the run
ended. Everything else (spawning, the node's stderr, stopping) is `Run`'s."""

from __future__ import annotations

import time

from neuronabox.launcher.hosts import HostLinkError, MemberLink, job_facts
from neuronabox.launcher.node_failure import first_failure
from neuronabox.launcher.ranks import ranks_env
from neuronabox.launcher.run import LaunchError, Run
from neuronabox.store import read_head

HELLO_TIMEOUT_S = 30.0  # how long the head may take to answer the hello
FAILED_WAIT_S = 5.0  # this node failed: how long to wait for the head's word on why (it may have begun elsewhere)
SUMMARY_WAIT_S = 60.0  # this node finished: how long to wait for the run's summary


class MemberRun(Run):
    """One real node's launcher on its own host: `join_and_run` instead of `execute` (a
    member has no result of its own); `cleanup` as any run's."""

    def join_and_run(self) -> str:
        """The run's summary as the head printed it, or LaunchError with the cause that
        ended the run."""
        job = self.job
        node = job.node_rank
        assert node is not None
        store = f"{job.master_addr}:{job.master_port}"
        try:
            link = read_head(job.master_addr, job.master_port, job.join_timeout_s)
        except TimeoutError as exc:
            raise LaunchError(
                f"no head at the store {store} in {job.join_timeout_s:g} s ({exc}): start node 0's launcher "
                "(--node-rank 0) there, or `neuronabox controller` when node 0 is emulated"
            ) from None
        try:
            self.member = MemberLink.join(link, node, job_facts(job), HELLO_TIMEOUT_S)
        except HostLinkError as exc:
            raise LaunchError(str(exc)) from None
        welcome = self.member.welcome
        print(f"neuronabox: real node {node} joined the run at {link}", flush=True)
        self.start_ranks(ranks_env(job, welcome.get("observer", ""), welcome.get("observer_secret", ""),
                                   mark=self.mark))  # fmt: skip
        while True:
            end = self.member.poll()
            if end is not None:
                raise LaunchError(f"the head ended the run: {end.get('end') or 'it finished without this node'}")
            first = first_failure(self.nodes)
            if first is not None:
                what = first.what()
                self.member.send({"failed": what})
                end = self.await_end(FAILED_WAIT_S)  # the head's cause: this node, or a loss before it
                if end and end.get("end"):
                    raise LaunchError(f"the head ended the run: {end['end']}")
                raise LaunchError(f"the job failed on real node {node}: {what}")
            if all(p.poll() == 0 for p in self.torchruns):
                break
            self.ranks.refresh()
            time.sleep(0.1)
        self.member.send({"done": True})
        end = self.await_end(SUMMARY_WAIT_S)
        if end is None:
            return f"real node {node} finished; the head sent no summary in {SUMMARY_WAIT_S:g} s"
        if end.get("end"):
            raise LaunchError(f"real node {node} finished, but the head ended the run: {end['end']}")
        return str(end.get("summary") or f"real node {node} finished")

    def await_end(self, timeout: float) -> dict | None:
        """A member: the head's end message, waiting up to `timeout`."""
        assert self.member is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            end = self.member.poll(timeout=min(0.2, max(0.01, deadline - time.monotonic())))
            if end is not None:
                return end
        return None

