"""The config module is the one reader of the environment; the README lists its switches."""
from __future__ import annotations

import ast
import os
import pathlib

import pytest

from nbxtensor import config

ROOT = pathlib.Path(__file__).resolve().parents[2]
BEGIN, END = "<!-- switches:begin -->", "<!-- switches:end -->"


def test_readme_lists_exactly_the_declared_switches():
    text = (ROOT / "README.md").read_text()
    assert BEGIN in text and END in text, "README.md lost its generated switch table"
    block = text.split(BEGIN, 1)[1].split(END, 1)[0].strip()
    assert block == config.markdown_table(), (
        "README.md's switch table is stale: paste config.markdown_table() between the markers "
        "(python -c 'import nbxtensor.config as c; print(c.markdown_table())')")


def test_no_environment_read_outside_the_config_module():
    pkg = ROOT / "src" / "nbxtensor"
    offenders = []
    for p in pkg.rglob("*.py"):
        if p.name == "config.py" and p.parent == pkg:
            continue
        tree = ast.parse(p.read_text(), str(p))
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv", "putenv") \
                    and isinstance(node.value, ast.Name) and node.value.id in ("os", "_os"):
                offenders.append(f"{p.relative_to(ROOT)}:{node.lineno}")
    assert offenders == []


@pytest.mark.parametrize("raw,want", [("1", True), ("on", True), ("YES", True), ("0", False),
                                      ("off", False), ("", True), (None, True)])
def test_bool_switch_parses(raw, want):
    assert config.SWITCHES["NBX_PDL"].parse(raw) is want


def test_bad_values_name_the_variable():
    with pytest.raises(ValueError, match="NBX_PDL='maybe'"):
        config.SWITCHES["NBX_PDL"].parse("maybe")
    with pytest.raises(ValueError, match=r"NBX_INDEX_CHECK='later'.*'async', 'sync'"):
        config.SWITCHES["NBX_INDEX_CHECK"].parse("later")
    with pytest.raises(KeyError, match="no switch 'NBX_NOPE'"):
        config.get("NBX_NOPE")
    with pytest.raises(KeyError, match="no switch 'NBX_NOPE'"):
        with config.override(NBX_NOPE=1):
            pass


def test_read_once_refresh_and_override(monkeypatch):
    monkeypatch.setenv("NBX_PROGRESS", "1")
    config.refresh()
    try:
        assert config.get("NBX_PROGRESS") == "1"
        monkeypatch.setenv("NBX_PROGRESS", "0")
        assert config.get("NBX_PROGRESS") == "1"          # parsed once, kept
        with config.override(NBX_PROGRESS="auto"):
            assert config.get("NBX_PROGRESS") == "auto"
            with config.override(NBX_PROGRESS="0"):
                assert config.get("NBX_PROGRESS") == "0"
            assert config.get("NBX_PROGRESS") == "auto"
        assert config.get("NBX_PROGRESS") == "1"          # the block's value is gone
        config.refresh()
        assert config.get("NBX_PROGRESS") == "0"          # read again after refresh
    finally:
        monkeypatch.delenv("NBX_PROGRESS")
        config.refresh()
    assert config.get("NBX_PROGRESS") == "auto"


def test_every_switch_has_a_doc_and_a_parsable_default():
    for name, s in config.SWITCHES.items():
        assert name.startswith("NBX_") and s.doc
        assert s.parse(None) == s.default
        if s.kind == "choice":
            assert s.default in s.choices
