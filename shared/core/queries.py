"""Runtime SQL, kept in named blocks in `shared/sql/*.sql`.

A file holds blocks introduced by `-- name: entity_verb_qualifier`; the text up to the next
marker is the statement. Parameters are `:name` placeholders, never string formatting.
Modules bind their statements at import time (`CLAIM = SQL["steps_claim"]`), so an unknown
name fails when the module is imported, not at 3 a.m.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from importlib import resources

_MARKER = re.compile(r"^--\s*name:\s*([a-z][a-z0-9_]*)\s*$", re.MULTILINE)


@dataclass(frozen=True)
class Query:
    name: str
    text: str

    def __str__(self) -> str:
        return self.name


class QueryFile:
    def __init__(self, file: str, blocks: dict[str, Query]) -> None:
        self.file = file
        self._blocks = blocks

    def __getitem__(self, name: str) -> Query:
        try:
            return self._blocks[name]
        except KeyError:
            raise KeyError(f"no query named {name!r} in shared/sql/{self.file}.sql") from None

    def names(self) -> list[str]:
        return sorted(self._blocks)


def parse_blocks(text: str) -> dict[str, Query]:
    parts = _MARKER.split(text)
    blocks: dict[str, Query] = {}
    # parts = [preamble, name1, body1, name2, body2, ...]
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        statement = body.strip().rstrip(";").strip()
        if name in blocks:
            raise ValueError(f"query {name!r} is defined twice")
        if not statement:
            raise ValueError(f"query {name!r} is empty")
        blocks[name] = Query(name, statement)
    return blocks


@cache
def load(file: str) -> QueryFile:
    """The named blocks of `shared/sql/<file>.sql`."""
    text = resources.files("shared").joinpath("sql", f"{file}.sql").read_text("utf-8")
    return QueryFile(file, parse_blocks(text))
