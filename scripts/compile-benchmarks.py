"""Concatenate docs/bench-results/*.md into docs/benchmarks.md (one section per area)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ORDER = [
    "sim", "simulator-scale", "live", "demo", "real-engine", "engine", "routing", "proxy",
    "admission", "precise", "faults", "calibrate", "forecast",
]  # fmt: skip

HEADER = """# Benchmarks

Every figure here comes from a script under `bench/` (or a `kvgate` command) that anyone
can rerun; each section names the machine, the command and the baseline measured in the
same run. These machines are shared and noisy, so compare ratios, not absolute numbers.
Tests check behaviour; performance lives here.

Sections: {toc}

"""


def main() -> None:
    results = ROOT / "docs" / "bench-results"
    files = {p.stem: p for p in results.glob("*.md")}
    names = [n for n in ORDER if n in files] + sorted(set(files) - set(ORDER))
    toc = ", ".join(f"[{n}](#{n})" for n in names)
    parts = [HEADER.format(toc=toc)]
    for name in names:
        text = files[name].read_text().strip()
        lines = text.splitlines()
        title = lines[0].lstrip("# ").strip() if lines and lines[0].startswith("#") else name
        body = "\n".join(lines[1:] if lines and lines[0].startswith("#") else lines)
        body = body.replace("\n## ", "\n### ")
        parts.append(f'<a id="{name}"></a>\n\n## {title}\n{body}\n')
    (ROOT / "docs" / "benchmarks.md").write_text("\n".join(parts))


if __name__ == "__main__":
    main()
