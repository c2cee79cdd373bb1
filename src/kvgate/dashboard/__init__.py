"""The read-only web dashboard served by the gateway at ``/dashboard``."""

from pathlib import Path

INDEX_HTML = Path(__file__).resolve().parent / "static" / "index.html"
