"""Every option of every ``kvgate`` subcommand says what it does and what it defaults to."""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Iterator

import pytest

from kvgate import __version__
from kvgate.adapters import ENGINE_TYPES
from kvgate.cli import SUBCOMMANDS, build_parser, main
from kvgate.engine.profiles import PROFILES
from kvgate.flags import FLAG_NAMES
from kvgate.routing.policies import policy_names
from kvgate.workloads import WORKLOAD_NAMES

# Options whose value is a name from a registry: their help (or choices) lists every name.
NAMED: dict[str, tuple[str, ...]] = {
    "--policy": tuple(policy_names()),
    "--policies": tuple(policy_names()),
    "--profile": tuple(PROFILES),
    "--engine-type": ENGINE_TYPES,
    "--flag": tuple(FLAG_NAMES),
}


def _subparsers(parser: argparse.ArgumentParser) -> Iterator[argparse._SubParsersAction]:  # type: ignore[type-arg]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            yield action


def _walk(
    parser: argparse.ArgumentParser, path: str
) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    yield path, parser
    for sub in _subparsers(parser):
        for name, child in sub.choices.items():
            yield from _walk(child, f"{path} {name}")


def _commands() -> list[tuple[str, argparse.ArgumentParser]]:
    top = build_parser()
    out: list[tuple[str, argparse.ArgumentParser]] = []
    for sub in _subparsers(top):
        for name, child in sub.choices.items():
            out.extend(_walk(child, f"kvgate {name}"))
    return out


COMMANDS = _commands()


def _options(parser: argparse.ArgumentParser) -> Iterator[argparse.Action]:
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
            continue
        yield action


def _expanded_help(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    formatter = parser._get_formatter()
    return formatter._expand_help(action)  # type: ignore[attr-defined,no-any-return]


def _meaningful_default(action: argparse.Action) -> bool:
    default = action.default
    if default is None or default is argparse.SUPPRESS or isinstance(default, bool):
        return False
    return default not in ([], "")


def test_every_subcommand_is_walked() -> None:
    names = {path.split()[1] for path, _ in COMMANDS}
    assert names == set(SUBCOMMANDS)
    assert "kvgate config apply" in {path for path, _ in COMMANDS}


@pytest.mark.parametrize(("path", "parser"), COMMANDS, ids=[p for p, _ in COMMANDS])
def test_every_option_has_help_and_default(path: str, parser: argparse.ArgumentParser) -> None:
    problems = []
    for action in _options(parser):
        name = "/".join(action.option_strings) or action.dest
        if not (action.help or "").strip():
            problems.append(f"{name}: no help text")
            continue
        text = _expanded_help(parser, action)
        if action.option_strings and _meaningful_default(action) and "default" not in text:
            problems.append(f"{name}: help does not state the default {action.default!r}")
    assert not problems, f"{path}: " + "; ".join(problems)


@pytest.mark.parametrize(("path", "parser"), COMMANDS, ids=[p for p, _ in COMMANDS])
def test_named_options_list_their_names(path: str, parser: argparse.ArgumentParser) -> None:
    problems = []
    for action in _options(parser):
        known = next((NAMED[o] for o in action.option_strings if o in NAMED), None)
        if "--workload" in action.option_strings and action.choices is None:
            known = WORKLOAD_NAMES
        if known is None or action.choices is not None:
            continue  # choices are listed by argparse itself
        text = _expanded_help(parser, action)
        missing = [n for n in known if n not in text]
        if missing:
            problems.append(f"{action.option_strings[0]} does not list {missing}")
    assert not problems, f"{path}: " + "; ".join(problems)


def test_help_renders_for_every_subcommand(capsys: pytest.CaptureFixture[str]) -> None:
    for path, _ in COMMANDS:
        with pytest.raises(SystemExit) as exc:
            main([*path.split()[1:], "--help"])
        assert exc.value.code == 0, path
        out = capsys.readouterr().out
        assert out.startswith("usage: kvgate"), path
        assert "(default: None)" not in out, path


def test_version_and_top_level_help() -> None:
    version = subprocess.run(
        [sys.executable, "-m", "kvgate", "--version"], capture_output=True, text=True, timeout=60
    )
    assert version.returncode == 0, version.stderr
    assert version.stdout.strip() == f"kvgate {__version__}"
    helped = subprocess.run(
        [sys.executable, "-m", "kvgate", "--help"], capture_output=True, text=True, timeout=60
    )
    assert helped.returncode == 0, helped.stderr
    for name in SUBCOMMANDS:
        assert name in helped.stdout
    assert "quick start" in helped.stdout


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["calibrate", "--target", "http://127.0.0.1:9", "--context", "1"], "--context must be"),
        (
            ["bench", "--target", "http://127.0.0.1:9", "--workload", "overload", "--rate", "0"],
            "--rate",
        ),
    ],
)
def test_arguments_that_do_not_fit_together_exit_2_naming_the_option(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"kvgate {argv[0]}: ") and message in err
