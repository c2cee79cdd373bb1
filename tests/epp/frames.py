"""Real ext_proc protobuf messages, as Envoy sends them, for the stream state machine."""

from __future__ import annotations

from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from google.protobuf import struct_pb2

from kvgate.epp import messages as msg


def headers(
    values: dict[str, str],
    *,
    end_of_stream: bool = False,
    mode: int = msg.FULL_DUPLEX,
    subset: list[str] | None = None,
) -> pb.ProcessingRequest:
    header_map = base_pb2.HeaderMap(
        headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in values.items()]
    )
    request = pb.ProcessingRequest(
        request_headers=pb.HttpHeaders(headers=header_map, end_of_stream=end_of_stream),
        protocol_config=pb.ProtocolConfiguration(
            request_body_mode=mode, response_body_mode=msg.FULL_DUPLEX
        ),
    )
    if subset is not None:
        hint = struct_pb2.Struct()
        hint.update({msg.SUBSET_KEY: subset})
        request.metadata_context.filter_metadata[msg.SUBSET_NAMESPACE].CopyFrom(hint)
    return request


def post(path: str, key: str | None = None, **kw: object) -> pb.ProcessingRequest:
    values = {":method": "POST", ":path": path, "content-type": "application/json"}
    if key is not None:
        values["authorization"] = f"Bearer {key}"
    return headers(values, **kw)  # type: ignore[arg-type]


def body(data: bytes, *, end_of_stream: bool) -> pb.ProcessingRequest:
    return pb.ProcessingRequest(request_body=pb.HttpBody(body=data, end_of_stream=end_of_stream))


def response_headers(
    status: int, extra: dict[str, str] | None = None, *, end_of_stream: bool = False
) -> pb.ProcessingRequest:
    values = {":status": str(status), **(extra or {})}
    header_map = base_pb2.HeaderMap(
        headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in values.items()]
    )
    return pb.ProcessingRequest(
        response_headers=pb.HttpHeaders(headers=header_map, end_of_stream=end_of_stream)
    )


def response_body(data: bytes, *, end_of_stream: bool) -> pb.ProcessingRequest:
    return pb.ProcessingRequest(response_body=pb.HttpBody(body=data, end_of_stream=end_of_stream))


def set_headers(mutation: pb.HeaderMutation) -> dict[str, str]:
    return {
        o.header.key: (o.header.raw_value.decode() if o.header.raw_value else o.header.value)
        for o in mutation.set_headers
    }
