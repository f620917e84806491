"""The control service takes calls only with the run's token: a local stranger
cannot stop a run or change its what-if, while `neuronabox status` (which reads
the token from the run's registry entry) still can read it."""

import subprocess
import sys

import grpc
from conftest import ROOT, SCRIPTS, Live, control_address
from neuronabox.controller import control_pb2, control_pb2_grpc


def test_a_stranger_cannot_stop_or_steer_a_run(tmp_path):
    go_on = tmp_path / "done"
    live = Live(
        "torchrun", "--nnodes", "2", str(SCRIPTS / "collectives.py"), "--repeat", "1", "--until-file", str(go_on),
        "--sizes", "1024", "--dtypes", "float32",
    )  # fmt: skip
    try:
        live.wait_line(r"iteration 0 done")
        st = subprocess.run(
            [sys.executable, "-m", "neuronabox.cli", "status"], capture_output=True, text=True, cwd=ROOT, timeout=30
        )
        address = control_address(live.proc.pid)  # other runs may be live: status lists them all
        assert f"run of launcher {live.proc.pid} (--address {address})" in st.stdout and "state running" in st.stdout
        stub = control_pb2_grpc.ControlStub(grpc.insecure_channel(address))
        for call, req in ((stub.Shutdown, control_pb2.ShutdownRequest(reason="stranger")),
                          (stub.Inject, control_pb2.InjectRequest(specs=["latency=+1s"])),
                          (stub.Status, control_pb2.StatusRequest())):  # fmt: skip
            try:
                call(req, timeout=5, metadata=(("x-neuronabox-token", "guess"),))
                raise AssertionError(f"{call} was taken without the token")
            except grpc.RpcError as exc:
                assert exc.code() == grpc.StatusCode.PERMISSION_DENIED
        st = subprocess.run(
            [sys.executable, "-m", "neuronabox.cli", "status", "--address", address],
            capture_output=True, text=True, cwd=ROOT, timeout=30,
        )  # fmt: skip
        assert st.returncode == 0 and "state running" in st.stdout
        go_on.touch()
        assert live.finish(timeout=120) == 0, live.err[-2000:]
    finally:
        live.stop()
    assert "latency" not in "".join(live.out)  # the stranger's what-if never took
