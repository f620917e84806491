"""The gRPC control service: status, per-kind counters, shutdown."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent import futures

import grpc

from . import control_pb2, control_pb2_grpc


class ControlService(control_pb2_grpc.ControlServicer):
    def __init__(
        self,
        snapshot: Callable[[bool], control_pb2.StatusReply],
        shutdown: Callable[[str], None],
        inject: Callable[[list[str], bool], list[str]] | None = None,
        finished: threading.Event | None = None,
    ) -> None:
        self._finished = finished or threading.Event()
        self._snapshot = snapshot
        self._shutdown = shutdown
        self._inject = inject

    def Status(self, request, context):  # noqa: N802 - gRPC method name
        return self._snapshot(False)

    def Shutdown(self, request, context):  # noqa: N802
        self._shutdown(request.reason or "requested")
        self._finished.wait(timeout=10)
        return self._snapshot(True)

    def Inject(self, request, context):  # noqa: N802
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


def connect(address: str, timeout: float = 5.0) -> control_pb2_grpc.ControlStub:
    channel = grpc.insecure_channel(address)
    grpc.channel_ready_future(channel).result(timeout=timeout)
    return control_pb2_grpc.ControlStub(channel)
