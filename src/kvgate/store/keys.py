"""Store key layout (DESIGN.md): etcd holds these; Redis mirrors them for counters."""

from __future__ import annotations

ROOT = "/kvgate"
TOTAL_QUOTA = f"{ROOT}/global/quota/total"
WATERMARK = f"{ROOT}/cluster/watermark"
NODES_PREFIX = f"{ROOT}/nodes/"
TENANTS_PREFIX = f"{ROOT}/tenant/"
FLAGS_PREFIX = f"{ROOT}/flags/"
CONFIG_PREFIX = f"{ROOT}/config/"


def node_key(node_id: str) -> str:
    return f"{NODES_PREFIX}{node_id}"


def tenant_quota_key(tenant: str) -> str:
    return f"{TENANTS_PREFIX}{tenant}/quota"


def flag_key(name: str) -> str:
    return f"{FLAGS_PREFIX}{name}"


def config_key(version: str) -> str:
    return f"{CONFIG_PREFIX}{version}"
