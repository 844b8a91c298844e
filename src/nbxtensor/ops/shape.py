"""shape ops (stub: filled by its family)."""
from __future__ import annotations

__all__: list[str] = []
