"""kvgate: cache-aware routing and global admission control for LLM inference."""

__version__ = "0.1.0"
