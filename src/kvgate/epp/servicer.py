"""The ext_proc gRPC service: one ``EppStream`` per ``ExternalProcessor.Process`` call."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

from kvgate.epp.metrics import EppMetrics
from kvgate.epp.stream import EppStream
from kvgate.gateway.gateway import Gateway


class ExternalProcessor(pb_grpc.ExternalProcessorServicer):  # type: ignore[misc]
    def __init__(self, gateway: Gateway, metrics: EppMetrics) -> None:
        self.gateway = gateway
        self.metrics = metrics

    async def Process(
        self,
        request_iterator: AsyncIterator[pb.ProcessingRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[pb.ProcessingResponse]:
        stream = EppStream(self.gateway, self.metrics)
        cancelled = False
        try:
            async for request in request_iterator:
                for response in await stream.handle(request):
                    yield response
                if stream.end == "answered":  # an ImmediateResponse ends Envoy's side
                    return
        except (asyncio.CancelledError, grpc.RpcError):
            cancelled = True
            raise
        finally:
            cancelled = cancelled or context.cancelled()
            # shielded: a second cancellation must not leave a reservation held
            await asyncio.shield(stream.close(cancelled=cancelled))


async def start_grpc(
    gateway: Gateway, metrics: EppMetrics, host: str, port: int
) -> tuple[grpc.aio.Server, int]:
    """The ext_proc server listening on ``host:port`` (0: a free port); (server, port)."""
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", gateway.config.server.max_body_bytes + 65536),
            ("grpc.max_send_message_length", gateway.config.server.max_body_bytes + 65536),
        ]
    )
    pb_grpc.add_ExternalProcessorServicer_to_server(ExternalProcessor(gateway, metrics), server)
    bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise OSError(f"cannot bind the ext_proc server to {host}:{port}")
    await server.start()
    return server, bound
