"""An Envoy bootstrap that puts ``kvgate epp`` in front of the engines.

One listener; the ext_proc filter (gRPC to the picker, ``failure_mode_allow: false``)
before the router; one ``ORIGINAL_DST`` cluster that sends each request to the
``ip:port`` the picker wrote in ``x-gateway-destination-endpoint``. The request body
mode is ``FULL_DUPLEX_STREAMED`` (the default), ``BUFFERED``, or ``STREAMED`` (which the
picker overrides to ``BUFFERED``: it decides on the whole body); the response body is
always streamed in full duplex. examples/envoy/envoy.yaml is this file for fixed ports.
"""

from __future__ import annotations

from typing import Any, Literal

from kvgate.epp.messages import DESTINATION_HEADER, LB_NAMESPACE, SUBSET_NAMESPACE

RequestBodyMode = Literal["FULL_DUPLEX_STREAMED", "BUFFERED", "STREAMED"]
_EXT_PROC = "type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor"
_HCM = (
    "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3."
    "HttpConnectionManager"
)
_ROUTER = "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
_HTTP2 = "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
_SET_METADATA = "type.googleapis.com/envoy.extensions.filters.http.set_metadata.v3.Config"


def bootstrap(
    *,
    listen_port: int,
    picker_port: int,
    admin_port: int,
    host: str = "127.0.0.1",
    picker_host: str = "127.0.0.1",
    request_body_mode: RequestBodyMode = "FULL_DUPLEX_STREAMED",
    subset: list[str] | None = None,
    message_timeout_s: float = 300.0,
    route_timeout_s: float = 600.0,
) -> dict[str, Any]:
    """The bootstrap as a dict (``yaml.safe_dump`` it). ``subset``: endpoints put in the
    ``envoy.lb.subset_hint`` metadata of every request (what an InferencePool's
    Gateway would set), forwarded to the picker."""
    filters: list[dict[str, Any]] = []
    if subset is not None:
        filters.append(
            {
                "name": "envoy.filters.http.set_metadata",
                "typed_config": {
                    "@type": _SET_METADATA,
                    "metadata": [
                        {
                            "metadata_namespace": SUBSET_NAMESPACE,
                            "value": {f"{DESTINATION_HEADER}-subset": subset},
                        }
                    ],
                },
            }
        )
    filters.append(
        {
            "name": "envoy.filters.http.ext_proc",
            "typed_config": {
                "@type": _EXT_PROC,
                "grpc_service": {"envoy_grpc": {"cluster_name": "kvgate_epp"}},
                "failure_mode_allow": False,
                "allow_mode_override": True,
                "message_timeout": f"{message_timeout_s:g}s",
                "processing_mode": {
                    "request_header_mode": "SEND",
                    "response_header_mode": "SEND",
                    "request_body_mode": request_body_mode,
                    "response_body_mode": "FULL_DUPLEX_STREAMED",
                    "request_trailer_mode": "SEND",
                    "response_trailer_mode": "SEND",
                },
                "metadata_options": {
                    "forwarding_namespaces": {"untyped": [SUBSET_NAMESPACE]},
                    "receiving_namespaces": {"untyped": [LB_NAMESPACE]},
                },
            },
        }
    )
    filters.append({"name": "envoy.filters.http.router", "typed_config": {"@type": _ROUTER}})
    route = {
        "match": {"prefix": "/"},
        "route": {
            "cluster": "original_destination_cluster",
            "timeout": f"{route_timeout_s:g}s",
        },
    }
    return {
        "admin": {"address": _address(host, admin_port)},
        "static_resources": {
            "listeners": [
                {
                    "name": "inference",
                    "address": _address(host, listen_port),
                    "filter_chains": [
                        {
                            "filters": [
                                {
                                    "name": "envoy.filters.network.http_connection_manager",
                                    "typed_config": {
                                        "@type": _HCM,
                                        "stat_prefix": "inference",
                                        "route_config": {
                                            "name": "inference",
                                            "virtual_hosts": [
                                                {
                                                    "name": "all",
                                                    "domains": ["*"],
                                                    "routes": [route],
                                                }
                                            ],
                                        },
                                        "http_filters": filters,
                                    },
                                }
                            ]
                        }
                    ],
                }
            ],
            "clusters": [
                {
                    "name": "original_destination_cluster",
                    "type": "ORIGINAL_DST",
                    "lb_policy": "CLUSTER_PROVIDED",
                    "connect_timeout": "2s",
                    "original_dst_lb_config": {
                        "use_http_header": True,
                        "http_header_name": DESTINATION_HEADER,
                    },
                },
                {
                    "name": "kvgate_epp",
                    "type": "STATIC",
                    "connect_timeout": "2s",
                    "typed_extension_protocol_options": {
                        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                            "@type": _HTTP2,
                            "explicit_http_config": {"http2_protocol_options": {}},
                        }
                    },
                    "load_assignment": {
                        "cluster_name": "kvgate_epp",
                        "endpoints": [
                            {
                                "lb_endpoints": [
                                    {"endpoint": {"address": _address(picker_host, picker_port)}}
                                ]
                            }
                        ],
                    },
                },
            ],
        },
    }


def _address(host: str, port: int) -> dict[str, Any]:
    return {"socket_address": {"address": host, "port_value": port}}
