"""Subcommands of `nbx` beyond `info` (generate, embed, tune), added by their families."""
from __future__ import annotations


def add_commands(sub) -> None:
    pass
