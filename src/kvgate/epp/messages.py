"""Envoy ext_proc messages the picker reads and writes: headers, mutations, answers.

Reading: a request's headers as a lower-cased mapping, the processing modes Envoy
announced, the subset hint in the forwarded metadata. Writing: header and body
responses (buffered: a body mutation; full duplex: a streamed body chunk), the chosen
endpoint as header and ``envoy.lb`` dynamic metadata, and ImmediateResponse answers
carrying the gateway's OpenAI-style error bodies.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.type.v3 import http_status_pb2
from google.protobuf import struct_pb2

from kvgate.gateway.errors import ApiError

DESTINATION_HEADER = "x-gateway-destination-endpoint"
LB_NAMESPACE = "envoy.lb"
SUBSET_NAMESPACE = "envoy.lb.subset_hint"
SUBSET_KEY = "x-gateway-destination-endpoint-subset"

BodyMode = processing_mode_pb2.ProcessingMode.BodySendMode
FULL_DUPLEX = BodyMode.Value("FULL_DUPLEX_STREAMED")
BUFFERED = BodyMode.Value("BUFFERED")
NO_BODY = BodyMode.Value("NONE")
STREAMED = BodyMode.Value("STREAMED")
BUFFERED_PARTIAL = BodyMode.Value("BUFFERED_PARTIAL")
_OVERWRITE = base_pb2.HeaderValueOption.HeaderAppendAction.Value("OVERWRITE_IF_EXISTS_OR_ADD")


def header_map(headers: pb.HttpHeaders) -> dict[str, str]:
    """The headers Envoy sent (pseudo-headers included), names lower-cased; a repeated
    name keeps its first value."""
    out: dict[str, str] = {}
    for h in headers.headers.headers:
        value = h.raw_value.decode("latin-1") if h.raw_value else h.value
        out.setdefault(h.key.lower(), value)
    return out


def subset_hint(request: pb.ProcessingRequest) -> frozenset[str] | None:
    """The ``ip:port`` endpoints Envoy allows for this request, or None (no hint: any)."""
    meta = request.metadata_context.filter_metadata
    if SUBSET_NAMESPACE not in meta:
        return None
    fields = meta[SUBSET_NAMESPACE].fields
    if SUBSET_KEY not in fields:
        return None
    value = fields[SUBSET_KEY]
    if value.HasField("list_value"):
        return frozenset(v.string_value for v in value.list_value.values if v.string_value)
    if value.HasField("string_value"):  # one endpoint, or several comma-separated
        return frozenset(p.strip() for p in value.string_value.split(",") if p.strip())
    return frozenset()


def header_mutation(
    set_headers: Mapping[str, str] | None = None, remove: Iterable[str] = ()
) -> pb.HeaderMutation:
    mutation = pb.HeaderMutation(remove_headers=list(remove))
    for key, value in (set_headers or {}).items():
        mutation.set_headers.append(
            base_pb2.HeaderValueOption(
                header=base_pb2.HeaderValue(key=key.lower(), raw_value=value.encode("latin-1")),
                append_action=_OVERWRITE,
            )
        )
    return mutation


def destination_metadata(endpoint: str) -> struct_pb2.Struct:
    """Dynamic metadata naming the chosen endpoint (``envoy.lb`` namespace)."""
    meta = struct_pb2.Struct()
    meta.update({LB_NAMESPACE: {DESTINATION_HEADER: endpoint}})
    return meta


def request_headers_response(
    mutation: pb.HeaderMutation | None = None,
    metadata: struct_pb2.Struct | None = None,
    *,
    buffer_body: bool = False,
) -> pb.ProcessingResponse:
    """``buffer_body``: ask Envoy (``allow_mode_override``) to buffer the request body."""
    common = pb.CommonResponse(header_mutation=mutation) if mutation else pb.CommonResponse()
    out = pb.ProcessingResponse(request_headers=pb.HeadersResponse(response=common))
    if metadata is not None:
        out.dynamic_metadata.CopyFrom(metadata)
    if buffer_body:
        out.mode_override.request_body_mode = BUFFERED
    return out


def response_headers_response(mutation: pb.HeaderMutation | None) -> pb.ProcessingResponse:
    common = pb.CommonResponse(header_mutation=mutation) if mutation else pb.CommonResponse()
    return pb.ProcessingResponse(response_headers=pb.HeadersResponse(response=common))


def body_response(
    body: bytes | None,
    *,
    request: bool,
    full_duplex: bool,
    end_of_stream: bool,
    mutation: pb.HeaderMutation | None = None,
    metadata: struct_pb2.Struct | None = None,
) -> pb.ProcessingResponse:
    """A (request or response) body answer. Full duplex: ``body`` is the next chunk Envoy
    sends on (b"" for none). Otherwise ``body`` replaces the buffered chunk (None: keep it)."""
    common = pb.CommonResponse()
    if mutation is not None:
        common.header_mutation.CopyFrom(mutation)
    if full_duplex:
        common.body_mutation.streamed_response.CopyFrom(
            pb.StreamedBodyResponse(body=body or b"", end_of_stream=end_of_stream)
        )
    elif body is not None:
        common.body_mutation.body = body
    answer = pb.BodyResponse(response=common)
    out = (
        pb.ProcessingResponse(request_body=answer)
        if request
        else pb.ProcessingResponse(response_body=answer)
    )
    if metadata is not None:
        out.dynamic_metadata.CopyFrom(metadata)
    return out


def trailers_response(*, request: bool) -> pb.ProcessingResponse:
    if request:
        return pb.ProcessingResponse(request_trailers=pb.TrailersResponse())
    return pb.ProcessingResponse(response_trailers=pb.TrailersResponse())


def immediate(
    status: int, body: bytes, headers: Mapping[str, str], *, details: str = ""
) -> pb.ProcessingResponse:
    """Envoy answers the client with this instead of sending the request on."""
    answer = pb.ImmediateResponse(
        status=http_status_pb2.HttpStatus(code=status),
        headers=header_mutation({"content-type": "application/json", **headers}),
        body=body,
        details=details,
    )
    return pb.ProcessingResponse(immediate_response=answer)


def error_response(error: ApiError, headers: Mapping[str, str]) -> pb.ProcessingResponse:
    """An ApiError as the OpenAI-style answer ``kvgate serve`` gives for it."""
    body = json.dumps(error.body()).encode()
    return immediate(
        error.status,
        body,
        {**headers, **error.headers},
        details=f"kvgate_{error.code or error.status}",
    )


def json_response(payload: Any, headers: Mapping[str, str]) -> pb.ProcessingResponse:
    return immediate(200, json.dumps(payload).encode(), headers)
