"""Every command in the docs' code blocks is one the code accepts, and the simulator ones run.

Commands are taken from fenced and indented code blocks of README.md and docs/*.md. Each
``kvgate …`` line must parse with the real ``kvgate`` parser and each ``python bench/….py``
line with that script's own parser (the script runs up to its ``parse_args`` call and
stops there). ``kvgate sim`` lines then run at 60 requests with ``--json`` and must
print a result for every policy they name.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import re
import runpy
import shlex
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvgate.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[2]
DOC_FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
KVGATE = re.compile(r"^(?:\.venv/bin/)?kvgate\s")
BENCH = re.compile(r"^(?:\.venv/bin/)?python3?\s+bench/\w+\.py\b")
INLINE_SIM = re.compile(r"`(kvgate sim [^`]+)`")
# Placeholders the docs use inside templates ("--workload W", "--nodes N") → a real value.
PLACEHOLDERS = {
    "W": "shared-prefix",
    "A": "1",
    "N": "8",
    "B": "64",
    "R": "1",
    "S": "64",
    "Q": "16",
    "T": "5",
    "DIR": "/tmp/kvgate-doc-sim",
}
EVENT_PLACEHOLDERS = {"KIND": "fail", "TIME": "5", "T": "5", "NODE": "node-0", "node": "node-0"}
PLACEHOLDER_BY_OPTION = {"--total-quota": "400000"}
SMALL_REQUESTS = "60"


def _code_lines(text: str) -> Iterator[tuple[int, str]]:
    """(line number, line) of every line inside a fenced or indented code block."""
    fenced = False
    previous_blank = True
    indented = False
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            yield number, line
            continue
        if line.startswith("    ") and (previous_blank or indented):
            indented = True
            yield number, line
        elif line.strip():
            indented = False
        previous_blank = not line.strip()


def _doc_commands() -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for path in DOC_FILES:
        lines = list(_code_lines(path.read_text()))
        i = 0
        while i < len(lines):
            number, line = lines[i]
            joined = line.strip()
            while joined.endswith("\\") and i + 1 < len(lines):
                i += 1
                joined = joined[:-1] + " " + lines[i][1].strip()
            i += 1
            for piece in joined.split("&&"):
                command = piece.strip().rstrip("&").strip()
                if KVGATE.match(command) or BENCH.match(command):
                    out.append((f"{path.name}:{number}", command))
        # `kvgate sim …` quoted in running text (it may wrap over lines)
        text = path.read_text()
        for match in INLINE_SIM.finditer(text):
            number = text.count("\n", 0, match.start()) + 1
            command = " ".join(match.group(1).split())
            if (f"{path.name}:{number}", command) not in out:
                out.append((f"{path.name}:{number}", command))
    return out


def _argv(command: str) -> list[str]:
    words = shlex.split(command, comments=True)
    argv: list[str] = []
    for i, word in enumerate(words):
        word = word.strip("[]")
        if not word:
            continue
        if "|" in word and not word.startswith("-"):
            word = word.split("|")[0]  # "raise|track|hold": one of the alternatives
        if i and words[i - 1] == "--event":
            word = ":".join(EVENT_PLACEHOLDERS.get(part, part) for part in word.split(":"))
        if word in PLACEHOLDERS:
            option = words[i - 1] if i else ""
            word = PLACEHOLDER_BY_OPTION.get(option, PLACEHOLDERS[word])
        argv.append(word)
    return argv


COMMANDS = _doc_commands()
SIM_COMMANDS = [(where, c) for where, c in COMMANDS if _argv(c)[1:2] == ["sim"]]


class _Parsed(Exception):
    pass


def _parse_bench(script: Path, args: list[str]) -> argparse.Namespace:
    """Run the script as __main__ until its parser has parsed ``args``; nothing more."""
    parsed: list[argparse.Namespace] = []
    original = argparse.ArgumentParser.parse_args

    def parse_and_stop(self: argparse.ArgumentParser, *a: object, **kw: object) -> object:
        parsed.append(original(self, *a, **kw))  # type: ignore[arg-type]
        raise _Parsed

    saved_argv, saved_path = sys.argv, list(sys.path)
    sys.argv = [str(script), *args]
    sys.path.insert(0, str(script.parent))
    argparse.ArgumentParser.parse_args = parse_and_stop  # type: ignore[assignment,method-assign]
    try:
        with contextlib.suppress(_Parsed):
            runpy.run_path(str(script), run_name="__main__")
    finally:
        argparse.ArgumentParser.parse_args = original  # type: ignore[method-assign]
        sys.argv, sys.path[:] = saved_argv, saved_path
    assert parsed, f"{script.name} never parsed its arguments"
    return parsed[0]


def test_docs_have_commands() -> None:
    assert len(COMMANDS) >= 20
    assert SIM_COMMANDS
    assert any(BENCH.match(c) for _, c in COMMANDS)


@pytest.mark.parametrize(("where", "command"), COMMANDS, ids=[w for w, _ in COMMANDS])
def test_doc_command_parses(where: str, command: str) -> None:
    argv = _argv(command)
    if KVGATE.match(command):
        try:
            build_parser().parse_args(argv[1:])
        except SystemExit as exc:
            pytest.fail(f"{where}: {command!r} does not parse (exit {exc.code})")
        return
    script = ROOT / argv[1]
    assert script.is_file(), f"{where}: no such script {argv[1]}"
    try:
        _parse_bench(script, argv[2:])
    except SystemExit as exc:
        pytest.fail(f"{where}: {command!r} does not parse (exit {exc.code})")


def _small(argv: list[str]) -> list[str]:
    """The same simulation at SMALL_REQUESTS requests, JSON out, no files written."""
    out: list[str] = []
    skip = False
    for word in argv:
        if skip:
            skip = False
            continue
        if word in ("--requests", "--out"):
            skip = True
            continue
        if word != "--json":
            out.append(word)
    return [*out, "--requests", SMALL_REQUESTS, "--json"]


@pytest.mark.parametrize(("where", "command"), SIM_COMMANDS, ids=[w for w, _ in SIM_COMMANDS])
def test_doc_sim_command_runs_small(where: str, command: str) -> None:
    argv = _small(_argv(command))[1:]
    args = build_parser().parse_args(argv)
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        code = main(argv)
    assert code == 0, f"{where}: {shlex.join(argv)} exited {code}"
    results = json.loads(stdout.getvalue())
    policies = args.policies.split(",")
    summaries = results.get("results", results)
    assert set(policies) <= set(summaries), f"{where}: results lack a policy: {list(summaries)}"
    for policy in policies:
        assert summaries[policy]["requests"] == int(SMALL_REQUESTS), (where, policy)
