"""Offline checks of the Kubernetes manifests under deploy/: schemas and cross-references.

Built-in kinds are validated against the Kubernetes OpenAPI schemas that the
``kubernetes-validate`` package ships (strict: unknown fields are errors, as with
``kubectl apply --validate=strict``); the Gateway API and Inference Extension kinds against
the JSON schemas in ``tests/deploy/schemas/``, written from their published API types.
Each check returns a list of problems (empty: valid), so a test can break a manifest and
assert that the check names what it broke.
"""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import yaml
from referencing import Registry, Resource

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
KUBERNETES = DEPLOY / "kubernetes"
SCHEMAS = Path(__file__).resolve().parent / "schemas"

# The oldest Kubernetes the manifests are written for (the preStop sleep action is on by
# default from 1.30) and the newest whose schemas the package ships: a field removed since
# 1.30 fails as surely as one not there yet.
KUBERNETES_VERSIONS = ("1.30", kubernetes_validate.utils.latest_version())

CRD_SCHEMAS = {
    ("inference.networking.k8s.io/v1", "InferencePool"): "inferencepool.json",
    ("gateway.networking.k8s.io/v1", "HTTPRoute"): "httproute.json",
    ("gateway.networking.k8s.io/v1", "Gateway"): "gateway.json",
    ("gateway.networking.k8s.io/v1", "GatewayClass"): "gatewayclass.json",
}
CLUSTER_SCOPED = frozenset({"Namespace", "GatewayClass", "ClusterRole", "ClusterRoleBinding"})

# The picker's command line, as the brief for `kvgate epp` fixes it.
EPP_COMMAND = ["kvgate"]
EPP_ARGS = ["epp", "--config", "/etc/kvgate/config.yaml", "--port", "9002", "--http-port", "8080"]
SECRET_VALUE = re.compile(r"^[A-Za-z0-9._~-]+$")


@dataclass
class Manifest:
    """One document of one YAML file under deploy/."""

    path: Path
    doc: dict[str, Any]

    @property
    def kind(self) -> str:
        return str(self.doc.get("kind", ""))

    @property
    def name(self) -> str:
        return str((self.doc.get("metadata") or {}).get("name", ""))

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}: {self.kind}/{self.name}"


def manifest_files() -> list[Path]:
    """Every YAML file under deploy/ except kustomization files (not cluster objects)."""
    files = [*DEPLOY.rglob("*.yaml"), *DEPLOY.rglob("*.yml")]
    return sorted(p for p in files if p.name not in ("kustomization.yaml", "kustomization.yml"))


def load_manifests(paths: Iterable[Path] | None = None) -> list[Manifest]:
    out = []
    for path in manifest_files() if paths is None else paths:
        for doc in yaml.safe_load_all(path.read_text()):
            if doc is not None:
                out.append(Manifest(path, doc))
    return out


def _crd_registry() -> Registry:
    registry: Registry = Registry()
    for path in SCHEMAS.glob("*.json"):
        schema = json.loads(path.read_text())
        registry = registry.with_resource(schema["$id"], Resource.from_contents(schema))
    return registry


_REGISTRY = _crd_registry()


def schema_errors(doc: dict[str, Any]) -> list[str]:
    """What makes ``doc`` invalid against its kind's schema; a kind without one is an error."""
    if not isinstance(doc, dict) or not doc.get("apiVersion") or not doc.get("kind"):
        return ["not a Kubernetes object: apiVersion and kind are required"]
    key = (doc["apiVersion"], doc["kind"])
    if key in CRD_SCHEMAS:
        uri = f"https://kvgate.invalid/deploy/schemas/{CRD_SCHEMAS[key]}"
        schema = _REGISTRY.contents(uri)
        validator = jsonschema.Draft202012Validator(schema, registry=_REGISTRY)
        return [
            f"{'.'.join(str(p) for p in e.absolute_path) or '(root)'}: {e.message}"
            for e in sorted(validator.iter_errors(doc), key=lambda e: list(e.absolute_path))
        ]
    errors = []
    for version in KUBERNETES_VERSIONS:
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.SchemaNotFoundError as exc:
            return [f"no schema for {doc['apiVersion']} {doc['kind']}: {exc.message}"]
        except kubernetes_validate.ValidationError as exc:
            where = ".".join(str(p) for p in exc.absolute_path) or "(root)"
            errors.append(f"{where}: {exc.message} (Kubernetes {version})")
    return errors


# -- cross-references -------------------------------------------------------------------


def _of(manifests: list[Manifest], kind: str) -> list[Manifest]:
    return [m for m in manifests if m.kind == kind]


def _namespace(m: Manifest) -> str:
    return str(m.doc["metadata"].get("namespace", "default"))


def _pod_spec(m: Manifest) -> dict[str, Any]:
    return m.doc["spec"]["template"]["spec"]


def _pod_labels(m: Manifest) -> dict[str, str]:
    return m.doc["spec"]["template"]["metadata"].get("labels") or {}


def _containers(m: Manifest) -> Iterator[dict[str, Any]]:
    spec = _pod_spec(m)
    yield from spec.get("initContainers") or []
    yield from spec.get("containers") or []


def _selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def flag_value(args: list[str], flag: str) -> str | None:
    """The value after ``flag`` in an argument list (``--flag value``), else None."""
    for i, arg in enumerate(args[:-1]):
        if arg == flag:
            return args[i + 1]
    return None


def _container_port(container: dict[str, Any], target: int | str) -> int | None:
    for port in container.get("ports") or []:
        if target in (port.get("name"), port.get("containerPort")):
            return int(port["containerPort"])
    return None


def epp_deployment(manifests: list[Manifest]) -> Manifest:
    """The Deployment that runs ``kvgate epp``."""
    for m in _of(manifests, "Deployment"):
        if any((c.get("args") or [])[:1] == ["epp"] for c in _pod_spec(m)["containers"]):
            return m
    raise LookupError("no Deployment runs `kvgate epp`")


def cross_reference_problems(manifests: list[Manifest]) -> list[str]:
    """References between the objects that Kubernetes would only find broken at run time."""
    problems: list[str] = []
    problems += _scope_problems(manifests)
    problems += _pool_problems(manifests)
    problems += _service_problems(manifests)
    problems += _route_problems(manifests)
    problems += _pod_reference_problems(manifests)
    problems += _epp_command_problems(manifests)
    return problems


def _scope_problems(manifests: list[Manifest]) -> list[str]:
    problems = []
    for m in manifests:
        has_ns = "namespace" in m.doc["metadata"]
        if m.kind in CLUSTER_SCOPED and has_ns:
            problems.append(f"{m.where}: cluster-scoped, must not set metadata.namespace")
        if m.kind not in CLUSTER_SCOPED and not has_ns:
            problems.append(f"{m.where}: namespaced, metadata.namespace is missing")
    return problems


def _pool_problems(manifests: list[Manifest]) -> list[str]:
    problems = []
    services = {(_namespace(s), s.name): s for s in _of(manifests, "Service")}
    deployments = _of(manifests, "Deployment")
    for pool in _of(manifests, "InferencePool"):
        spec = pool.doc["spec"]
        selector = spec["selector"]["matchLabels"]
        members = [
            d
            for d in deployments
            if _namespace(d) == _namespace(pool) and _selects(selector, _pod_labels(d))
        ]
        if not members:
            problems.append(f"{pool.where}: selector {selector} matches no Deployment's pods")
        for d in members:
            exposed = {p for c in _pod_spec(d)["containers"] for p in _ports(c)}
            for tp in spec["targetPorts"]:
                if tp["number"] not in exposed:
                    problems.append(
                        f"{pool.where}: targetPort {tp['number']} is no containerPort of "
                        f"{d.kind}/{d.name}"
                    )
        ref = spec.get("endpointPickerRef")
        if ref is None:
            problems.append(f"{pool.where}: no endpointPickerRef (kvgate is the picker)")
            continue
        service = services.get((_namespace(pool), ref["name"]))
        if service is None:
            problems.append(f"{pool.where}: endpointPickerRef names no Service {ref['name']!r}")
            continue
        number = (ref.get("port") or {}).get("number")
        port = next((p for p in service.doc["spec"]["ports"] if p["port"] == number), None)
        if port is None:
            problems.append(f"{pool.where}: Service {service.name} has no port {number}")
            continue
        picked = _serving_container(deployments, service, port.get("targetPort", port["port"]))
        if picked is None:
            problems.append(
                f"{pool.where}: Service {service.name} port {number} reaches no container"
            )
            continue
        deployment, container, container_port = picked
        if flag_value(container.get("args") or [], "--port") != str(container_port):
            problems.append(
                f"{pool.where}: {deployment.name}/{container['name']} does not listen on "
                f"--port {container_port}, the port the pool's picker Service targets"
            )
        if _selects(selector, _pod_labels(deployment)):
            problems.append(f"{pool.where}: the selector also picks the picker's own pods")
    return problems


def _ports(container: dict[str, Any]) -> set[int]:
    return {int(p["containerPort"]) for p in container.get("ports") or []}


def _serving_container(
    deployments: list[Manifest], service: Manifest, target: int | str
) -> tuple[Manifest, dict[str, Any], int] | None:
    selector = service.doc["spec"].get("selector") or {}
    for d in deployments:
        if _namespace(d) != _namespace(service) or not _selects(selector, _pod_labels(d)):
            continue
        for c in _pod_spec(d)["containers"]:
            port = _container_port(c, target)
            if port is not None:
                return d, c, port
    return None


def _service_problems(manifests: list[Manifest]) -> list[str]:
    problems = []
    deployments = _of(manifests, "Deployment")
    for service in _of(manifests, "Service"):
        for port in service.doc["spec"]["ports"]:
            target = port.get("targetPort", port["port"])
            if _serving_container(deployments, service, target) is None:
                problems.append(
                    f"{service.where}: port {port['port']} (targetPort {target!r}) reaches no "
                    "container of the pods its selector picks"
                )
    for pdb in _of(manifests, "PodDisruptionBudget"):
        selector = pdb.doc["spec"]["selector"]["matchLabels"]
        if not any(_selects(selector, _pod_labels(d)) for d in deployments):
            problems.append(f"{pdb.where}: selector {selector} matches no Deployment's pods")
    return problems


def _route_problems(manifests: list[Manifest]) -> list[str]:
    problems = []
    pools = {(_namespace(p), p.name) for p in _of(manifests, "InferencePool")}
    gateways = {(_namespace(g), g.name): g for g in _of(manifests, "Gateway")}
    classes = {c.name for c in _of(manifests, "GatewayClass")}
    for gw in gateways.values():
        if gw.doc["spec"]["gatewayClassName"] not in classes:
            problems.append(f"{gw.where}: gatewayClassName names no GatewayClass")
    for route in _of(manifests, "HTTPRoute"):
        ns = _namespace(route)
        for ref in route.doc["spec"].get("parentRefs") or []:
            gw = gateways.get((ref.get("namespace", ns), ref["name"]))
            if gw is None:
                problems.append(f"{route.where}: parentRef names no Gateway {ref['name']!r}")
                continue
            listeners = {li["name"] for li in gw.doc["spec"]["listeners"]}
            if "sectionName" in ref and ref["sectionName"] not in listeners:
                problems.append(
                    f"{route.where}: Gateway {gw.name} has no listener {ref['sectionName']!r}"
                )
        refs = [
            r
            for rule in route.doc["spec"].get("rules") or []
            for r in rule.get("backendRefs") or []
        ]
        if not any(r.get("kind") == "InferencePool" for r in refs):
            problems.append(f"{route.where}: no backendRef is an InferencePool")
        for ref in refs:
            if ref.get("kind") != "InferencePool":
                continue
            if ref.get("group") != "inference.networking.k8s.io":
                problems.append(f"{route.where}: InferencePool backendRef needs its API group")
            if (ref.get("namespace", ns), ref["name"]) not in pools:
                problems.append(f"{route.where}: backendRef names no InferencePool {ref['name']!r}")
    return problems


def _pod_reference_problems(manifests: list[Manifest]) -> list[str]:
    """ConfigMaps, Secrets (and their keys) and ServiceAccounts that pods name exist."""
    problems = []
    configmaps = {
        (_namespace(c), c.name): c.doc.get("data") or {} for c in _of(manifests, "ConfigMap")
    }
    secrets = {(_namespace(s), s.name): _secret_data(s) for s in _of(manifests, "Secret")}
    accounts = {(_namespace(a), a.name) for a in _of(manifests, "ServiceAccount")}
    for d in _of(manifests, "Deployment"):
        ns, spec = _namespace(d), _pod_spec(d)
        account = spec.get("serviceAccountName")
        if account and (ns, account) not in accounts:
            problems.append(f"{d.where}: serviceAccountName names no ServiceAccount {account!r}")
        volumes = {v["name"] for v in spec.get("volumes") or []}
        for v in spec.get("volumes") or []:
            if "configMap" in v:
                problems += _keys_problems(d, "ConfigMap", configmaps, ns, v["configMap"])
            if "secret" in v:
                ref = {"name": v["secret"]["secretName"], "items": v["secret"].get("items")}
                problems += _keys_problems(d, "Secret", secrets, ns, ref)
        for c in _containers(d):
            for mount in c.get("volumeMounts") or []:
                if mount["name"] not in volumes:
                    problems.append(f"{d.where}: {c['name']} mounts no volume {mount['name']!r}")
            for env in c.get("env") or []:
                ref = (env.get("valueFrom") or {}).get("secretKeyRef")
                if ref is not None:
                    data = secrets.get((ns, ref["name"]))
                    if data is None or ref["key"] not in data:
                        problems.append(
                            f"{d.where}: {c['name']} env {env['name']} names no Secret key "
                            f"{ref['name']}/{ref['key']}"
                        )
    for s in _of(manifests, "Secret"):
        for key, value in _secret_data(s).items():
            if not SECRET_VALUE.match(value):
                problems.append(f"{s.where}: {key} is not a URL-safe token (see the file's note)")
    return problems


def _secret_data(secret: Manifest) -> dict[str, str]:
    data = {k: base64.b64decode(v).decode() for k, v in (secret.doc.get("data") or {}).items()}
    data.update(secret.doc.get("stringData") or {})
    return data


def _keys_problems(
    d: Manifest,
    kind: str,
    known: dict[tuple[str, str], dict[str, str]],
    ns: str,
    ref: dict[str, Any],
) -> list[str]:
    data = known.get((ns, ref["name"]))
    if data is None:
        return [f"{d.where}: a volume names no {kind} {ref['name']!r}"]
    return [
        f"{d.where}: {kind} {ref['name']} has no key {item['key']!r}"
        for item in ref.get("items") or []
        if item["key"] not in data
    ]


def _epp_command_problems(manifests: list[Manifest]) -> list[str]:
    try:
        epp = epp_deployment(manifests)
    except LookupError as exc:
        return [str(exc)]
    container = next(
        c for c in _pod_spec(epp)["containers"] if (c.get("args") or [])[:1] == ["epp"]
    )
    if container.get("command") != EPP_COMMAND or container.get("args") != EPP_ARGS:
        return [f"{epp.where}: the picker must run `{' '.join(EPP_COMMAND + EPP_ARGS)}`"]
    return []


# -- the picker's config file -----------------------------------------------------------


def _field_value(path: str, pod_name: str) -> str:
    return {"metadata.name": pod_name, "status.podIP": "10.0.0.7"}.get(path, f"<{path}>")


def render_epp_config(
    manifests: list[Manifest], out: Path, pod_name: str
) -> subprocess.CompletedProcess[str]:
    """Run the epp pod's render-config init container, as written in the manifest, on the
    ConfigMap it mounts, with the environment it would get (Secret keys, pod fields):
    writes the config file the picker reads to ``out`` (the return's returncode says if)."""
    epp = epp_deployment(manifests)
    ns, spec = _namespace(epp), _pod_spec(epp)
    (init,) = [c for c in spec.get("initContainers") or [] if c["name"] == "render-config"]
    python, dash_c, script, template_path, output_path = init["command"]
    assert (python, dash_c) == ("python", "-c"), "render-config runs python -c SCRIPT SRC DST"
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["name"]: m["mountPath"] for m in init["volumeMounts"]}
    (cm_volume,) = [n for n in mounts if "configMap" in volumes[n]]
    assert template_path.startswith(mounts[cm_volume] + "/"), "SRC is in the ConfigMap mount"
    configmap = next(
        c
        for c in _of(manifests, "ConfigMap")
        if c.name == volumes[cm_volume]["configMap"]["name"] and _namespace(c) == ns
    )
    epp_container = next(c for c in spec["containers"] if c.get("args", [])[:1] == ["epp"])
    epp_mounts = {m["name"]: m["mountPath"] for m in epp_container["volumeMounts"]}
    (shared,) = [n for n in mounts if n in epp_mounts and "emptyDir" in volumes[n]]
    read = flag_value(epp_container["args"], "--config")
    assert output_path == read, f"render-config writes {output_path}, the picker reads {read}"
    assert output_path.startswith(epp_mounts[shared] + "/"), "DST is on the shared emptyDir"
    secrets = {s.name: _secret_data(s) for s in _of(manifests, "Secret") if _namespace(s) == ns}
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVGATE_")}
    for var in init.get("env") or []:
        source = var.get("valueFrom") or {}
        if "secretKeyRef" in source:
            ref = source["secretKeyRef"]
            if ref["key"] in secrets.get(ref["name"], {}):
                env[var["name"]] = secrets[ref["name"]][ref["key"]]
        elif "fieldRef" in source:
            env[var["name"]] = _field_value(source["fieldRef"]["fieldPath"], pod_name)
        else:
            env[var["name"]] = var["value"]
    local_template = out.parent / "template" / Path(template_path).name
    local_template.parent.mkdir(parents=True, exist_ok=True)
    local_template.write_text(configmap.doc["data"][Path(template_path).name])
    return subprocess.run(
        [sys.executable, "-c", script, str(local_template), str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
