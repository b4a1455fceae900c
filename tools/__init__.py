"""Command-line tools: benchmark, schedule trace, model statistics (run as python -m tools.X)."""

__all__ = []
