"""The gRPC control service: status, per-kind counters, shutdown, what-if changes.

It listens on loopback, where any local process can connect, so every call must
carry the run's control token (metadata TOKEN_KEY): the controller writes it to
its ready file, the launcher to the run's registry entry (both mode 0600), and
`neuronabox status` and `inject` read it from there. A call without it is refused.
"""

from __future__ import annotations

import hmac
import threading
from collections.abc import Callable
from concurrent import futures

import grpc

from . import control_pb2, control_pb2_grpc

TOKEN_KEY = "x-neuronabox-token"


class ControlService(control_pb2_grpc.ControlServicer):
    def __init__(
        self,
        snapshot: Callable[[bool], control_pb2.StatusReply],
        shutdown: Callable[[str], None],
        inject: Callable[[list[str], bool], list[str]] | None = None,
        finished: threading.Event | None = None,
        token: str = "",
    ) -> None:
        self._finished = finished or threading.Event()
        self._snapshot = snapshot
        self._shutdown = shutdown
        self._inject = inject
        self._token = token

    def _admit(self, context) -> None:
        """Refuse a call without the run's token (aborting raises out of the handler)."""
        if not self._token:
            return
        given = dict(context.invocation_metadata()).get(TOKEN_KEY, "")
        if not hmac.compare_digest(given.encode(), self._token.encode()):
            context.abort(grpc.StatusCode.PERMISSION_DENIED, "this run's control token is missing or wrong")

    def Status(self, request, context):  # noqa: N802 - gRPC method name
        self._admit(context)
        return self._snapshot(False)

    def Shutdown(self, request, context):  # noqa: N802
        self._admit(context)
        self._shutdown(request.reason or "requested")
        self._finished.wait(timeout=10)
        return self._snapshot(True)

    def Inject(self, request, context):  # noqa: N802
        self._admit(context)
        if self._inject is None:
            return control_pb2.InjectReply(error="this controller takes no what-if changes")
        try:
            active = self._inject(list(request.specs), request.clear)
        except ValueError as exc:
            return control_pb2.InjectReply(error=str(exc))
        return control_pb2.InjectReply(active=active)


def serve(service: ControlService, host: str) -> tuple[grpc.Server, int]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    control_pb2_grpc.add_ControlServicer_to_server(service, server)
    port = server.add_insecure_port(f"{host}:0")
    server.start()
    return server, port


class ControlClient:
    """The control stub, with the run's token on every call."""

    def __init__(self, stub: control_pb2_grpc.ControlStub, token: str) -> None:
        self._stub, self._metadata = stub, ((TOKEN_KEY, token),)

    def Status(self, request, timeout: float):  # noqa: N802 - the gRPC method's name
        return self._stub.Status(request, timeout=timeout, metadata=self._metadata)

    def Shutdown(self, request, timeout: float):  # noqa: N802
        return self._stub.Shutdown(request, timeout=timeout, metadata=self._metadata)

    def Inject(self, request, timeout: float):  # noqa: N802
        return self._stub.Inject(request, timeout=timeout, metadata=self._metadata)


def connect(address: str, timeout: float = 5.0, token: str = "") -> ControlClient:
    channel = grpc.insecure_channel(address)
    grpc.channel_ready_future(channel).result(timeout=timeout)
    return ControlClient(control_pb2_grpc.ControlStub(channel), token)
