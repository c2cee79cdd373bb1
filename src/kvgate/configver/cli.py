"""``kvgate config``: versioned config with baselines and one-command rollback."""

from __future__ import annotations

import argparse
import asyncio
import getpass
import json
import socket
import sys
import urllib.error
import urllib.request
from typing import Any

import yaml

from kvgate.cli import add_gateway_arguments
from kvgate.yaml_file import read_yaml

DESCRIPTION = """\
The effective config (routing, admission with tenants, flags, capacity profiles) is
kept as immutable numbered versions in the store (/kvgate/config/<n>) with author,
time and a diff; /kvgate/config/active says which one every replica runs, and each
replica hot-reloads it within 2 s (see kvgate_config_version and /health).

  kvgate config show [--version N]        the active (or given) version's document
  kvgate config history                   every version, the active one and baselines
  kvgate config diff [--from A] [--to B]  what changed (default: active vs its parent)
  kvgate config apply FILE [-m MSG]       FILE's versioned sections on top of the active
                                          version → a new version, made active; an
                                          invalid FILE changes nothing (exit 1)
  kvgate config rollback                  back to the active version's parent
  kvgate config rollback --to N           back to version N
  kvgate config rollback --to-baseline B  back to the version marked as baseline B
  kvgate config baseline NAME [--version N]  mark the active (or given) version

Talks to a gateway's admin API (--gateway, --admin-token) or, with --store, directly
to the store (etcd://… for a cluster).
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description = DESCRIPTION
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    add_gateway_arguments(p)
    p.add_argument("--store", default=None, help="use this store directly instead of a gateway")
    p.add_argument("--author", default=None, help="who makes the change (default user@host)")
    p.add_argument("--json", action="store_true", help="print JSON")
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    show = sub.add_parser("show", help="print the active (or a given) version")
    show.add_argument("--version", type=int, default=None, help="version number")
    sub.add_parser("history", help="list versions, the active one and baselines")
    diff = sub.add_parser("diff", help="changes between two versions")
    diff.add_argument("--from", dest="frm", type=int, default=None, help="older version")
    diff.add_argument("--to", type=int, default=None, help="newer version (default active)")
    apply = sub.add_parser("apply", help="apply a YAML file as a new version")
    apply.add_argument(
        "file", help="YAML with any of: routing, admission, flags, capacity_profiles"
    )
    apply.add_argument("-m", "--message", default="", help="why (kept with the version)")
    rb = sub.add_parser("rollback", help="make an earlier version active")
    group = rb.add_mutually_exclusive_group()
    group.add_argument("--to", type=int, default=None, help="version number")
    group.add_argument("--to-baseline", default=None, metavar="NAME", help="a named baseline")
    base = sub.add_parser("baseline", help="mark a version as a named known-good baseline")
    base.add_argument("name", help="baseline name")
    base.add_argument("--version", type=int, default=None, help="version (default: active)")


class CommandError(RuntimeError):
    pass


def _author(args: argparse.Namespace) -> str:
    if args.author:
        return str(args.author)
    try:
        user = getpass.getuser()
    except Exception:
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


# -- two ways to reach the versions ---------------------------------------------------


class HttpClient:
    def __init__(self, base: str, token: str | None) -> None:
        self.base = base.rstrip("/")
        self.token = token

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.base + path, data=data, method=method)
        req.add_header("Content-Type", "application/json")
        if self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return json.loads(resp.read() or b"{}")
        except urllib.error.HTTPError as exc:
            try:
                message = json.loads(exc.read())["error"]["message"]
            except Exception:
                message = f"HTTP {exc.code}"
            raise CommandError(message) from None
        except OSError as exc:
            raise CommandError(f"cannot reach {self.base}: {exc}") from None


def _run_store(url: str, action: Any) -> Any:
    from kvgate.configver.versions import VersionStore
    from kvgate.store import open_store

    async def go() -> Any:
        store = open_store(url)
        try:
            return await action(VersionStore(store))
        finally:
            await store.close()

    return asyncio.run(go())


def run(args: argparse.Namespace) -> int:
    try:
        out = _dispatch(args)
    except CommandError as exc:
        print(f"kvgate config: {exc}", file=sys.stderr)
        return 1
    if args.json or not isinstance(out, str):
        print(json.dumps(out, indent=2, sort_keys=True, default=str))
    else:
        print(out)
    return 0


def _dispatch(args: argparse.Namespace) -> Any:
    from kvgate.configver import VersionError, prepare_apply
    from kvgate.gateway.config import ConfigError

    author = _author(args)
    http = None if args.store else HttpClient(args.gateway, args.admin_token)
    action = args.action
    try:
        if action == "apply":
            update = _read_yaml(args.file)
            if http is not None:
                res = http.call(
                    "POST",
                    "/admin/config/apply",
                    {"document": update, "author": author, "message": args.message},
                )
                return (
                    res if args.json else _applied_text(res["version"], res["diff"], res["ignored"])
                )

            async def apply(vs: Any) -> Any:
                doc, ignored = await prepare_apply(vs, update)
                v = await vs.apply(doc, author=author, message=args.message)
                return v.header(), v.diff, ignored

            header, diff, ignored = _run_store(args.store, apply)
            return (
                {"version": header, "diff": diff}
                if args.json
                else _applied_text(header, diff, ignored)
            )
        if action == "rollback":
            body = {"to": args.to, "baseline": args.to_baseline, "author": author}
            if http is not None:
                act = http.call("POST", "/admin/config/rollback", body)["active"]
            else:
                a = _run_store(
                    args.store,
                    lambda vs: vs.rollback(by=author, to=args.to, baseline=args.to_baseline),
                )
                act = {"version": a.version, "previous": a.previous, "action": a.action}
            return act if args.json else f"active: version {act['version']} (was {act['previous']})"
        if action == "baseline":
            if http is not None:
                res = http.call(
                    "POST",
                    "/admin/config/baselines",
                    {"name": args.name, "version": args.version, "author": author},
                )
                n = res["version"]
            else:
                n = _run_store(
                    args.store,
                    lambda vs: vs.mark_baseline(args.name, by=author, version=args.version),
                )
            return (
                {"name": args.name, "version": n}
                if args.json
                else f"baseline {args.name} = version {n}"
            )
        if action == "history":
            if http is not None:
                return http.call("GET", "/admin/config/versions")

            async def hist(vs: Any) -> Any:
                act = await vs.activation()
                return {
                    "active": act.version if act else None,
                    "versions": [v.header() for v in await vs.history()],
                    "baselines": await vs.baselines(),
                }

            return _run_store(args.store, hist)
        if action == "show":
            which = "active" if args.version is None else str(args.version)
            if http is not None:
                res = http.call("GET", f"/admin/config/versions/{which}")
            else:

                async def show(vs: Any) -> Any:
                    return (await vs.resolve(args.version)).detail()

                res = _run_store(args.store, show)
            if args.json:
                return res
            head = {k: v for k, v in res.items() if k not in ("document", "diff")}
            return (
                yaml.safe_dump(head, sort_keys=False)
                + "---\n"
                + yaml.safe_dump(res["document"], sort_keys=False)
            )
        if action == "diff":
            if http is not None:
                q = "&".join(
                    f"{k}={v}" for k, v in (("from", args.frm), ("to", args.to)) if v is not None
                )
                res = http.call("GET", "/admin/config/diff" + (f"?{q}" if q else ""))
            else:
                res = _run_store(args.store, lambda vs: vs.changes(args.frm, args.to))
            if args.json:
                return res
            return f"version {res['from']} -> {res['to']}\n" + (
                "\n".join(res["diff"]) or "(no changes)"
            )
    except (VersionError, ConfigError) as exc:
        raise CommandError(str(exc)) from None
    except ConnectionError as exc:
        raise CommandError(f"store unavailable: {exc}") from None
    raise CommandError(f"unknown action {action!r}")


def _read_yaml(path: str) -> dict[str, Any]:
    data = read_yaml(path, CommandError)
    if not isinstance(data, dict):
        raise CommandError(f"{path}: the top level must be a mapping")
    return data


def _applied_text(header: dict[str, Any], diff: list[str], ignored: list[str]) -> str:
    lines = [f"version {header['version']} active (from {header['parent']}): {len(diff)} change(s)"]
    lines += [f"  {d}" for d in diff]
    if ignored:
        lines.append(f"ignored (per-process, not versioned): {', '.join(ignored)}")
    return "\n".join(lines)
