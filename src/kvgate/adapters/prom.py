"""A strict parser for the Prometheus text exposition format (0.0.4 and OpenMetrics text).

Strict on purpose: a scrape cut short or corrupted must be noticed (the report is then
marked stale) rather than silently read as "zero requests running".
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}


class MetricsParseError(ValueError):
    """The text is not valid exposition format; the message names the line."""


@dataclass(frozen=True, slots=True)
class Sample:
    name: str
    labels: dict[str, str]
    value: float


@dataclass(slots=True)
class MetricSet:
    """All samples of one scrape, grouped by sample name."""

    samples: dict[str, list[Sample]] = field(default_factory=dict)
    types: dict[str, str] = field(default_factory=dict)  # family name -> counter|gauge|...

    def add(self, sample: Sample) -> None:
        self.samples.setdefault(sample.name, []).append(sample)

    def has(self, name: str) -> bool:
        return name in self.samples

    def get(self, name: str, **labels: str) -> list[Sample]:
        return [
            s
            for s in self.samples.get(name, ())
            if all(s.labels.get(k) == v for k, v in labels.items())
        ]

    def total(self, name: str, **labels: str) -> float | None:
        """Sum over all label sets (e.g. several engines or models behind one port)."""
        found = self.get(name, **labels)
        if not found:
            return None
        return sum(s.value for s in found if not math.isnan(s.value))

    def first_total(self, names: Iterable[str]) -> float | None:
        """The total of the first name present (metric names change across versions)."""
        return _first_present(self.total, names)

    def mean(self, name: str) -> float | None:
        """The mean over label sets: right for fractions such as KV usage per engine."""
        found = self._values(name)
        return sum(found) / len(found) if found else None

    def first_mean(self, names: Iterable[str]) -> float | None:
        return _first_present(self.mean, names)

    def maximum(self, name: str) -> float | None:
        found = self._values(name)
        return max(found) if found else None

    def _values(self, name: str) -> list[float]:
        return [s.value for s in self.samples.get(name, ()) if not math.isnan(s.value)]


def _first_present(read: Callable[[str], float | None], names: Iterable[str]) -> float | None:
    for name in names:
        value = read(name)
        if value is not None:
            return value
    return None


def parse_value(text: str) -> float:
    lowered = text.lower()
    if lowered in ("+inf", "inf"):
        return math.inf
    if lowered == "-inf":
        return -math.inf
    if lowered == "nan":
        return math.nan
    try:
        return float(text)
    except ValueError:
        raise MetricsParseError(f"bad sample value {text[:40]!r}") from None


def _parse_labels(line: str, pos: int, lineno: int) -> tuple[dict[str, str], int]:
    """Parse ``{a="x",b="y"}`` starting at ``line[pos] == '{'``; return labels and end pos."""
    labels: dict[str, str] = {}
    pos += 1
    n = len(line)
    while True:
        while pos < n and line[pos] in " \t":
            pos += 1
        if pos < n and line[pos] == "}":
            return labels, pos + 1
        m = _LABEL_NAME.match(line, pos)
        if not m:
            raise MetricsParseError(f"line {lineno}: bad label name")
        name = m.group(0)
        pos = m.end()
        if pos + 1 >= n or line[pos] != "=" or line[pos + 1] != '"':
            raise MetricsParseError(f'line {lineno}: expected =" after label {name}')
        pos += 2
        chars: list[str] = []
        while True:
            if pos >= n:
                raise MetricsParseError(f"line {lineno}: unterminated label value")
            c = line[pos]
            if c == "\\":
                if pos + 1 >= n or line[pos + 1] not in _ESCAPES:
                    raise MetricsParseError(f"line {lineno}: bad escape in label value")
                chars.append(_ESCAPES[line[pos + 1]])
                pos += 2
                continue
            if c == '"':
                pos += 1
                break
            chars.append(c)
            pos += 1
        labels[name] = "".join(chars)
        if pos < n and line[pos] == ",":
            pos += 1
            continue
        if pos < n and line[pos] == "}":
            return labels, pos + 1
        raise MetricsParseError(f"line {lineno}: expected , or }} in labels")


def parse_sample_line(line: str, lineno: int = 0) -> Sample:
    m = _NAME.match(line)
    if not m:
        raise MetricsParseError(f"line {lineno}: bad metric name")
    name = m.group(0)
    pos = m.end()
    labels: dict[str, str] = {}
    if pos < len(line) and line[pos] == "{":
        labels, pos = _parse_labels(line, pos, lineno)
    rest = line[pos:].split()
    if not rest or len(rest) > 2 or (pos < len(line) and line[pos] not in " \t"):
        raise MetricsParseError(f"line {lineno}: expected '<name> <value> [timestamp]'")
    value = parse_value(rest[0])
    if len(rest) == 2:
        parse_value(rest[1])  # the timestamp must at least be a number
    return Sample(name, labels, value)


def parse_metrics(text: str, *, skip_suffixes: tuple[str, ...] = ()) -> MetricSet:
    """Parse a whole scrape. Raises MetricsParseError on the first malformed line.

    The format requires the last line to end with a line feed; a body without one was
    cut short in transit, so it is refused like any other malformed text.
    ``skip_suffixes``: samples whose metric name ends so (e.g. histogram ``_bucket``
    lines, two thirds of an engine's scrape) are passed over unparsed.
    """
    if not text.strip():
        raise MetricsParseError("empty metrics text")
    if not text.endswith("\n"):
        raise MetricsParseError("metrics text does not end with a line feed (truncated?)")
    out = MetricSet()
    for lineno, raw in enumerate(text.split("\n"), start=1):
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            parts = line.split(None, 3)
            if len(parts) >= 2 and parts[1] == "EOF":
                break
            if len(parts) >= 2 and parts[1] == "TYPE":
                if len(parts) < 4 or not _NAME.fullmatch(parts[2]):
                    raise MetricsParseError(f"line {lineno}: bad TYPE line")
                out.types[parts[2]] = parts[3].strip()
            continue
        if skip_suffixes:
            m = _NAME.match(line)
            if m is not None and m.group(0).endswith(skip_suffixes):
                continue
        out.add(parse_sample_line(line, lineno))
    return out
