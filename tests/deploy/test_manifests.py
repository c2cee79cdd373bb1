"""deploy/kubernetes, checked offline: every manifest against its kind's schema, the
references between them, and the picker's config file through kvgate's own loader."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvgate.gateway.config import ConfigError, GatewayConfig, load_config, parse_config
from tests.deploy.manifests import (
    CLUSTER_SCOPED,
    CRD_SCHEMAS,
    EPP_ARGS,
    KUBERNETES,
    Manifest,
    cross_reference_problems,
    epp_deployment,
    flag_value,
    load_manifests,
    manifest_files,
    render_epp_config,
    schema_errors,
)

POD_NAME = "kvgate-epp-7d9f8c6b5-x2k4q"


@pytest.fixture(scope="module")
def manifests() -> list[Manifest]:
    return load_manifests()


def _one(manifests: list[Manifest], kind: str, name: str | None = None) -> Manifest:
    (m,) = [m for m in manifests if m.kind == kind and (name is None or m.name == name)]
    return m


def _broken(manifests: list[Manifest]) -> list[Manifest]:
    """A deep copy to break."""
    return [Manifest(m.path, copy.deepcopy(m.doc)) for m in manifests]


def _render(manifests: list[Manifest], tmp_path: Path) -> GatewayConfig:
    out = tmp_path / "etc" / "config.yaml"
    out.parent.mkdir(parents=True)
    result = render_epp_config(manifests, out, POD_NAME)
    assert result.returncode == 0, result.stderr
    return parse_config(load_config(out))


# -- every manifest is valid --------------------------------------------------------------


def test_the_deployment_has_every_piece(manifests: list[Manifest]) -> None:
    kinds = {m.kind for m in manifests}
    assert {
        "InferencePool",
        "HTTPRoute",
        "Gateway",
        "GatewayClass",
        "Deployment",
        "Service",
        "ConfigMap",
        "Secret",
        "ServiceAccount",
    } <= kinds
    assert len([m for m in manifests if m.kind == "Deployment"]) == 3  # epp, redis, vLLM


@pytest.mark.parametrize(
    "path", manifest_files(), ids=lambda p: str(p.relative_to(KUBERNETES.parent))
)
def test_every_manifest_matches_its_schema(path: Path) -> None:
    docs = load_manifests([path])
    assert docs, f"{path}: no documents"
    for m in docs:
        assert schema_errors(m.doc) == [], m.where


def test_the_inference_pool_uses_the_ga_api(manifests: list[Manifest]) -> None:
    pool = _one(manifests, "InferencePool")
    assert pool.doc["apiVersion"] == "inference.networking.k8s.io/v1"
    assert ("inference.networking.k8s.io/v1", "InferencePool") in CRD_SCHEMAS


def test_the_references_between_manifests_hold(manifests: list[Manifest]) -> None:
    assert cross_reference_problems(manifests) == []


def test_the_kustomization_lists_every_namespaced_file_and_nothing_cluster_scoped() -> None:
    kustomization = yaml.safe_load((KUBERNETES / "kustomization.yaml").read_text())
    listed = set(kustomization["resources"])
    present = {p.name for p in KUBERNETES.glob("*.yaml") if p.name != "kustomization.yaml"}
    assert listed == present
    for name in listed:
        kinds = {m.kind for m in load_manifests([KUBERNETES / name])}
        assert not kinds & CLUSTER_SCOPED, f"{name}: cluster-scoped objects belong in cluster/"
    cluster = {m.kind for m in load_manifests(sorted((KUBERNETES / "cluster").glob("*.yaml")))}
    assert cluster and cluster <= CLUSTER_SCOPED
    namespace = _one(load_manifests(), "Namespace")
    assert kustomization["namespace"] == namespace.name


# -- the schema check rejects broken manifests --------------------------------------------


def _mutate(doc: dict[str, Any], path: str | tuple[str, ...], value: Any = ...) -> dict[str, Any]:
    """A copy of ``doc`` with ``path`` (dotted, or a tuple where a key holds dots) set to
    ``value``, or deleted when ``value`` is ``...``."""
    out = copy.deepcopy(doc)
    keys = path.split(".") if isinstance(path, str) else list(path)
    parts = [int(p) if p.isdigit() else p for p in keys]
    node: Any = out
    for part in parts[:-1]:
        node = node[part]
    if value is ...:
        del node[parts[-1]]
    else:
        node[parts[-1]] = value
    return out


@pytest.mark.parametrize(
    ("kind", "name", "path", "value", "says"),
    [
        # required fields dropped
        ("InferencePool", None, "spec.targetPorts", ..., "'targetPorts' is a required property"),
        ("InferencePool", None, "spec.selector.matchLabels", ..., "'matchLabels' is a required"),
        ("InferencePool", None, "spec.endpointPickerRef.port", ..., "'port' is a required"),
        ("InferencePool", None, "spec.endpointPickerRef.name", ..., "'name' is a required"),
        ("HTTPRoute", None, "spec.rules.0.backendRefs.0.name", ..., "'name' is a required"),
        ("Gateway", None, "spec.gatewayClassName", ..., "'gatewayClassName' is a required"),
        ("Gateway", None, "spec.listeners.0.protocol", ..., "'protocol' is a required"),
        ("GatewayClass", None, "spec.controllerName", ..., "'controllerName' is a required"),
        ("Deployment", "kvgate-epp", "spec.selector", ..., "'selector' is a required property"),
        ("Service", "kvgate-epp", "spec.ports.0.port", ..., "'port' is a required property"),
        # wrong types and values
        ("InferencePool", None, "spec.targetPorts.0.number", "8000", "is not of type 'integer'"),
        ("InferencePool", None, "spec.targetPorts.0.number", 70000, "is greater than"),
        ("InferencePool", None, "spec.endpointPickerRef.failureMode", "Open", "is not one of"),
        ("InferencePool", None, "spec.selector.matchLabels", {}, "should be non-empty"),
        ("HTTPRoute", None, "spec.rules.0.timeouts.request", "10 minutes", "does not match"),
        ("HTTPRoute", None, "spec.rules.0.matches.0.path.value", "v1", "does not match"),
        ("Gateway", None, "spec.listeners.0.port", "80", "is not of type 'integer'"),
        ("Service", "kvgate-epp", "spec.ports.0.port", "9002", "is not of type 'integer'"),
        ("Deployment", "kvgate-epp", "spec.replicas", "two", "is not of type 'integer'"),
        ("ConfigMap", None, "data", ["config.yaml"], "is not of type 'object'"),
        ("Secret", None, "stringData", "admin-token", "is not of type 'object'"),
        ("ServiceAccount", None, "automountServiceAccountToken", "no", "is not of type 'boolean'"),
        # unknown fields (typos) are errors, as with kubectl's strict validation
        ("InferencePool", None, "spec.targetPort", 8000, "Additional properties"),
        ("HTTPRoute", None, "spec.rules.0.backendRef", [], "Additional properties"),
        ("Deployment", "kvgate-epp", "spec.template.spec.containers.0.imagee", "x", "Additional"),
        ("GatewayClass", None, "metadata.namespace", "kvgate", "should not be valid"),
    ],
)
def test_the_schema_check_rejects_a_broken_manifest(
    manifests: list[Manifest], kind: str, name: str | None, path: str, value: Any, says: str
) -> None:
    original = _one(manifests, kind, name).doc
    assert schema_errors(original) == []
    errors = schema_errors(_mutate(original, path, value))
    assert errors, f"{kind} with {path} broken passed the schema check"
    assert any(says in e for e in errors), errors


def test_a_service_backend_ref_needs_a_port(manifests: list[Manifest]) -> None:
    """group and kind default to the core Service, whose port is then required; an
    InferencePool backendRef has none."""
    route = _one(manifests, "HTTPRoute").doc
    ref = route["spec"]["rules"][0]["backendRefs"][0]
    assert "port" not in ref
    as_service = _mutate(
        _mutate(route, "spec.rules.0.backendRefs.0.group"), "spec.rules.0.backendRefs.0.kind"
    )
    assert any("'port' is a required" in e for e in schema_errors(as_service))
    with_port = _mutate(as_service, "spec.rules.0.backendRefs.0.port", 8000)
    assert schema_errors(with_port) == []


def test_a_kind_without_a_schema_is_rejected() -> None:
    doc = {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}}
    assert schema_errors(doc)[0].startswith("no schema for example.com/v1 Widget")
    assert schema_errors({"metadata": {"name": "w"}}) != []


# -- the cross-reference check rejects broken references ----------------------------------


@pytest.mark.parametrize(
    ("kind", "name", "path", "value", "says"),
    [
        ("InferencePool", None, "spec.endpointPickerRef.name", "kvgate-picker", "names no Service"),
        ("InferencePool", None, "spec.endpointPickerRef.port.number", 9003, "has no port 9003"),
        (
            "InferencePool",
            None,
            ("spec", "selector", "matchLabels", "kvgate.dev/pool"),
            "other",
            "matches no",
        ),
        ("InferencePool", None, "spec.targetPorts.0.number", 8001, "targetPort 8001 is no"),
        ("Service", "kvgate-epp", "spec.ports.0.targetPort", "grpcc", "reaches no container"),
        (
            "Service",
            "kvgate-epp",
            ("spec", "selector", "app.kubernetes.io/name"),
            "epp",
            "reaches no",
        ),
        ("HTTPRoute", None, "spec.rules.0.backendRefs.0.name", "pool", "names no InferencePool"),
        ("HTTPRoute", None, "spec.parentRefs.0.sectionName", "https", "has no listener"),
        ("HTTPRoute", None, "spec.parentRefs.0.name", "gw", "names no Gateway"),
        ("Gateway", None, "spec.gatewayClassName", "eg", "names no GatewayClass"),
        ("Deployment", "kvgate-epp", "spec.template.spec.containers.0.args.4", "9003", "--port"),
        ("Deployment", "kvgate-epp", "spec.template.spec.serviceAccountName", "epp", "names no"),
        (
            "Deployment",
            "kvgate-epp",
            "spec.template.spec.volumes.0.configMap.name",
            "c",
            "names no",
        ),
        (
            "Deployment",
            "kvgate-epp",
            "spec.template.spec.initContainers.0.env.1.valueFrom.secretKeyRef.key",
            "admin_token",
            "names no Secret key",
        ),
        ("Secret", None, "stringData.admin-token", 'to"ken: x', "not a URL-safe token"),
        ("InferencePool", None, "metadata.namespace", ..., "metadata.namespace is missing"),
    ],
)
def test_the_cross_reference_check_rejects_a_broken_reference(
    manifests: list[Manifest], kind: str, name: str | None, path: str, value: Any, says: str
) -> None:
    broken = _broken(manifests)
    target = _one(broken, kind, name)
    target.doc = _mutate(target.doc, path, value)
    problems = cross_reference_problems(broken)
    assert any(says in p for p in problems), problems


def test_the_picker_runs_with_exactly_the_documented_flags(manifests: list[Manifest]) -> None:
    epp = epp_deployment(manifests)
    (container,) = epp.doc["spec"]["template"]["spec"]["containers"]
    assert container["command"] + container["args"] == ["kvgate", *EPP_ARGS]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"grpc": 9002, "http": 8080}


# -- the picker's config file loads with kvgate's loader ----------------------------------


def test_the_rendered_config_loads_with_kvgates_loader(
    manifests: list[Manifest], tmp_path: Path
) -> None:
    config = _render(manifests, tmp_path)
    secret = _one(manifests, "Secret").doc["stringData"]
    assert config.gateway_id == POD_NAME
    assert config.auth.admin_token == secret["admin-token"]
    keys = {t.name: t.api_keys for t in config.admission.tenants}
    assert keys == {
        "chat-app": [secret["chat-app-api-key"]],
        "batch-jobs": [secret["batch-jobs-api-key"]],
    }
    assert config.scrape.mode == "registry"
    epp = epp_deployment(manifests)
    (container,) = epp.doc["spec"]["template"]["spec"]["containers"]
    assert str(config.server.port) == flag_value(container["args"], "--http-port")
    assert config.server.host == "0.0.0.0"
    # the model-server sidecars report to the store the picker reads, at the pool's port
    vllm = _one(manifests, "Deployment", "vllm-qwen").doc["spec"]["template"]["spec"]
    (sidecar,) = [c for c in vllm["containers"] if c["name"] == "kvgate-sidecar"]
    assert flag_value(sidecar["args"], "--store") == config.store
    advertised = flag_value(sidecar["args"], "--advertise-url")
    pool_ports = [p["number"] for p in _one(manifests, "InferencePool").doc["spec"]["targetPorts"]]
    assert advertised == f"http://$(POD_IP):{pool_ports[0]}"
    assert flag_value(sidecar["args"], "--node-id") == "$(POD_NAME)"
    assert {e["name"] for e in sidecar["env"]} == {"POD_NAME", "POD_IP"}


def test_the_rendered_config_file_is_private(manifests: list[Manifest], tmp_path: Path) -> None:
    _render(manifests, tmp_path)
    assert (tmp_path / "etc" / "config.yaml").stat().st_mode & 0o777 == 0o600


@pytest.mark.parametrize(
    ("old", "new", "says"),
    [
        ("routing:\n", "routng:\n", "routng"),
        ("  policy: hybrid\n", "  policy: cache-magic\n", "policy"),
        ("      weight: 3\n", "      weight: heavy\n", "weight"),
        ("  mode: registry\n", "  mode: push\n", "mode"),
        ("store: redis://", "store: redys://", "store"),
    ],
)
def test_a_config_typo_fails(
    manifests: list[Manifest], tmp_path: Path, old: str, new: str, says: str
) -> None:
    broken = _broken(manifests)
    configmap = _one(broken, "ConfigMap")
    text = configmap.doc["data"]["config.yaml"]
    assert old in text
    configmap.doc["data"]["config.yaml"] = text.replace(old, new, 1)
    with pytest.raises(ConfigError, match=says):
        _render(broken, tmp_path)


def test_a_placeholder_without_a_secret_fails_the_render(
    manifests: list[Manifest], tmp_path: Path
) -> None:
    broken = _broken(manifests)
    del _one(broken, "Secret").doc["stringData"]["chat-app-api-key"]
    out = tmp_path / "config.yaml"
    result = render_epp_config(broken, out, POD_NAME)
    assert result.returncode != 0
    assert "${KVGATE_KEY_CHAT_APP}" in result.stderr
    assert not out.exists()
    # the error names the placeholder, never another secret's value
    secret = _one(manifests, "Secret").doc["stringData"]
    assert secret["admin-token"] not in result.stderr
