"""A SQL table as a polling source: the "not handled yet" query, checked and rendered.

    table: acme.signups         # in the schema named after the workflow's tenant (here acme)
    key: id                     # unique per row: the record's identity
    stamp: onceflow_enrolled_at # NULL while the row is not handled yet
    where: "onceflow_enrolled_at is null and plan = 'pro'"

The workflow author writes `where`, and it runs inside onceflow's database, so it is not
passed through as SQL: it is parsed as a conjunction of simple comparisons (`col is [not]
null`, `col <op> literal` with = <> != < <= > >=, `col in (literal, …)`; literals are
'strings', numbers, true and false), its first term must be `<stamp> is null`, and it is
rendered back with quoted identifiers and literals written by us. The rendered text is the
same in the poll query and in the `CREATE INDEX … WHERE …` suggested when no index answers the
query, so a partial index created from the suggestion is one the planner can prove it matches.

Identifiers come from the definition (validated here) and the key column's type from the
catalog; nothing a request sends ever reaches this SQL.

A tenant polls only its own tables: each tenant's tables live in the schema named after it
(`tenant_problem`), checked by `validate` (the definition's tenant), by activation (the
activating tenant) and by every pass (a definition activated before the rule), since the poll
reads and stamps with onceflow's own database role, which can read every schema.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

from shared.core.db import Tx

IDENT = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
# The schema part is a tenant id (shared/publishing/validate.py TENANT_PATTERN: it may hold a
# `-` or start with a digit; quoted, it needs no escaping either).
TABLE = re.compile(r"^([a-z0-9_][a-z0-9_-]{0,62})\.([a-z_][a-z0-9_]{0,62})$")
# onceflow's own tables live in `public`; the system catalogs are never a source either.
FORBIDDEN_SCHEMAS = frozenset({"public", "pg_catalog", "information_schema", "pg_toast"})
_TOKEN = re.compile(
    r"\s*(?:(?P<str>'(?:[^']|'')*')|(?P<num>-?\d+(?:\.\d+)?)|(?P<ident>[A-Za-z_][A-Za-z0-9_]*)"
    r"|(?P<op><=|>=|<>|!=|=|<|>)|(?P<punct>[(),]))"
)
_OPS = {"=", "<>", "!=", "<", "<=", ">", ">="}


class SourceInvalid(ValueError):
    """A source the definition cannot use; `field` is the `table` field at fault."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class Literal:
    sql: str  # rendered by us: a quoted string, a number, TRUE or FALSE


@dataclass(frozen=True)
class Term:
    column: str
    op: str  # "is null", "is not null", a comparison operator, or "in"
    values: tuple[Literal, ...] = ()

    def render(self) -> str:
        col = quote(self.column)
        if self.op in ("is null", "is not null"):
            return f"{col} {self.op.upper()}"
        if self.op == "in":
            return f"{col} IN ({', '.join(v.sql for v in self.values)})"
        return f"{col} {self.op} {self.values[0].sql}"


def quote(identifier: str) -> str:
    # Only ever called with names that matched IDENT, so there is no quote to escape.
    return f'"{identifier}"'


def _tokens(text: str) -> Iterator[tuple[str, str]]:
    pos = 0
    while pos < len(text):
        if text[pos:].strip() == "":
            return
        m = _TOKEN.match(text, pos)
        if m is None or m.end() == pos:
            raise SourceInvalid("where", f"cannot read `where` at {text[pos:].strip()[:20]!r}")
        kind = m.lastgroup
        assert kind is not None
        yield kind, m.group(kind)
        pos = m.end()


def _literal(kind: str, value: str) -> Literal:
    if kind == "str":
        inner = value[1:-1].replace("''", "'")
        return Literal("'" + inner.replace("'", "''") + "'")
    if kind == "num":
        return Literal(value)
    if kind == "ident" and value.lower() in ("true", "false"):
        return Literal(value.upper())
    raise SourceInvalid(
        "where", f"expected a literal ('text', a number, true or false), not {value!r}"
    )


def parse_where(text: str) -> tuple[Term, ...]:
    """`where` as its terms; SourceInvalid saying what it cannot read."""
    reader = _Reader(list(_tokens(text)))
    terms = [reader.term()]
    while not reader.done():
        word = reader.take()
        if word[0] != "ident" or word[1].lower() != "and":
            raise SourceInvalid(
                "where", f"terms are joined with `and` (no or, no functions); found {word[1]!r}"
            )
        terms.append(reader.term())
    return tuple(terms)


class _Reader:
    def __init__(self, toks: list[tuple[str, str]]) -> None:
        self.toks = toks
        self.i = 0

    def done(self) -> bool:
        return self.i >= len(self.toks)

    def peek(self, offset: int = 0) -> tuple[str, str] | None:
        at = self.i + offset
        return self.toks[at] if at < len(self.toks) else None

    def take(self, what: str = "more") -> tuple[str, str]:
        tok = self.peek()
        if tok is None:
            raise SourceInvalid("where", f"`where` ends where it needs {what}")
        self.i += 1
        return tok

    def word(self, offset: int = 0) -> str:
        tok = self.peek(offset)
        return tok[1].lower() if tok and tok[0] == "ident" else ""

    def term(self) -> Term:
        kind, column = self.take("a column name")
        if kind != "ident" or not IDENT.match(column):
            raise SourceInvalid("where", f"expected a lower-case column name, found {column!r}")
        kind, value = self.take(f"a comparison after `{column}`")
        if kind == "ident" and value.lower() == "is":
            if self.word() == "null":
                self.i += 1
                return Term(column, "is null")
            if self.word() == "not" and self.word(1) == "null":
                self.i += 2
                return Term(column, "is not null")
            raise SourceInvalid("where", f"`{column} is` must be followed by null or not null")
        if kind == "op" and value in _OPS:
            op = "<>" if value == "!=" else value
            return Term(column, op, (_literal(*self.take(f"a value after `{column} {value}`")),))
        if kind == "ident" and value.lower() == "in":
            return Term(column, "in", self.in_list(column))
        raise SourceInvalid(
            "where", f"`{column}` must be followed by is [not] null, a comparison or in (…)"
        )

    def in_list(self, column: str) -> tuple[Literal, ...]:
        if self.take(f"( after `{column} in`") != ("punct", "("):
            raise SourceInvalid("where", f"`{column} in` needs a parenthesised list")
        values = [_literal(*self.take("a value"))]
        while (sep := self.take("`)`")) == ("punct", ","):
            values.append(_literal(*self.take("a value")))
        if sep != ("punct", ")"):
            raise SourceInvalid("where", "an `in (…)` list is literals separated by commas")
        return tuple(values)


@dataclass(frozen=True)
class TableSource:
    schema: str
    table: str
    key: str
    stamp: str
    terms: tuple[Term, ...]

    @property
    def qualified(self) -> str:
        return f"{quote(self.schema)}.{quote(self.table)}"

    @property
    def name(self) -> str:
        return f"{self.schema}.{self.table}"

    @property
    def predicate(self) -> str:
        return " AND ".join(t.render() for t in self.terms)

    @property
    def columns(self) -> list[str]:
        return list(dict.fromkeys([self.key, self.stamp, *(t.column for t in self.terms)]))

    def create_index(self) -> str:
        """The partial index that answers the poll query: the pending rows, in key order."""
        return (
            f"CREATE INDEX CONCURRENTLY {self.table}_{self.stamp}_pending "
            f"ON {self.qualified} ({quote(self.key)}) WHERE {self.predicate};"
        )

    def page_query(self, key_type: str, *, after: bool, states: bool = False) -> str:
        """A page of pending rows in key order, the first (`after` False) or the one after
        the key `:after`: keyset paging, so every page is a range read of the index.
        `key_type` comes from the catalog (`format_type`), never from the definition.

        With `states`, each row comes with its poll state for the workflow `:workflow_id`
        (poll_record_state, migrations/0230) read by the same statement, so under the same
        snapshot as the row: a row another pass stamped and closed meanwhile is either seen
        pending and open, or not seen at all, never pending and closed."""
        resume = f"AND {quote(self.key)} > CAST(:after AS {key_type}) " if after else ""
        page = (
            f"SELECT CAST({quote(self.key)} AS text) AS key, to_jsonb(t) AS row, "
            f"{quote(self.key)} AS sort_key "
            f"FROM {self.qualified} t WHERE {self.predicate} {resume}"
            f"ORDER BY {quote(self.key)} LIMIT CAST(:limit AS integer)"
        )
        if not states:
            return page
        # The page is a subquery so that `where` names only the table's columns (a column
        # called `status` is not the state's); its order is kept by the native key.
        return (
            "SELECT page.key, page.row, s.generation, s.attempts, s.status, s.outcome "
            f"FROM ({page}) AS page LEFT JOIN LATERAL "
            "poll_record_state(CAST(:workflow_id AS uuid), page.key) AS s ON true "
            "ORDER BY page.sort_key"
        )

    def stamp_query(self, key_type: str) -> str:
        """Stamp the given rows if they are still unstamped; the keys stamped."""
        return (
            f"UPDATE {self.qualified} SET {quote(self.stamp)} = now() "
            f"WHERE {quote(self.key)} = ANY(CAST(:keys AS {key_type}[])) "
            f"AND {quote(self.stamp)} IS NULL RETURNING CAST({quote(self.key)} AS text) AS key"
        )


def parse_source(raw: Any) -> TableSource:
    """A `table` source from its definition fields (a model or a mapping)."""
    data = raw.model_dump() if hasattr(raw, "model_dump") else dict(raw)
    m = TABLE.match(str(data.get("table", "")))
    if m is None:
        raise SourceInvalid(
            "table",
            "`table` is schema.table in lower case, the schema named after the tenant (e.g. "
            "acme.signups); "
            f"found {data.get('table')!r}",
        )
    schema, table = m.groups()
    if schema in FORBIDDEN_SCHEMAS:
        raise SourceInvalid(
            "table",
            f"tables in schema {schema!r} are onceflow's own or the system's; poll the "
            "application's tables, in its own schema",
        )
    for name in ("key", "stamp"):
        if not IDENT.match(str(data.get(name, ""))):
            raise SourceInvalid(
                name, f"`{name}` is a lower-case column name; found {data.get(name)!r}"
            )
    terms = parse_where(str(data.get("where", "")))
    stamp = data["stamp"]
    if terms[0] != Term(stamp, "is null"):
        raise SourceInvalid(
            "where",
            f"`where` starts with `{stamp} is null` (the rows not handled yet), then `and …`",
        )
    if data["key"] == stamp:
        raise SourceInvalid("stamp", "the stamp column cannot be the key")
    return TableSource(schema, table, data["key"], stamp, terms)


def tenant_problem(source: TableSource, tenant_id: str) -> str | None:
    """Why the tenant may not poll this table (None: it may). Each tenant's tables live in
    the schema named after it, so a definition can never name another tenant's table."""
    if source.schema == tenant_id:
        return None
    return (
        f"tenant {tenant_id!r} polls only its own tables, in the schema named after it: "
        f"`{tenant_id}.{source.table}`, not `{source.name}` (a schema of another tenant, or "
        "no tenant's, is never read)"
    )


# ---------------------------------------------------------------- against the database


def check_against_database(tx: Tx, source: TableSource, *, batch: int) -> tuple[str, list[str]]:
    """The key column's type, and the problems found: a missing table or column, or a poll
    query no index answers (the message holds the CREATE INDEX to add)."""
    rows = tx.all(
        "SELECT a.attname AS name, format_type(a.atttypid, a.atttypmod) AS type"
        " FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid"
        " JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = :schema AND c.relname = :table AND a.attnum > 0"
        " AND NOT a.attisdropped",
        schema=source.schema,
        table=source.table,
    )
    if not rows:
        return "", [f"table {source.name} does not exist"]
    types = {r["name"]: r["type"] for r in rows}
    missing = [c for c in source.columns if c not in types]
    if missing:
        return "", [f"table {source.name} has no column {', '.join(missing)}"]
    key_type = types[source.key]
    if not _index_answers(tx, source, batch, key_type) and not _a_defined_index_answers(
        tx, source, batch, key_type
    ):
        return key_type, [
            f"no index answers the poll query on {source.name} (it would read the whole table "
            f"every pass); add: {source.create_index()}"
        ]
    return key_type, []


def _index_answers(tx: Tx, source: TableSource, batch: int, key_type: str) -> bool:
    """Whether an index finds the pending rows: no sequential scan, and the stamp condition
    is not a filter applied row by row (as it would be on an index of the key alone, which
    walks every row, handled or not, to find the few that aren't).

    Sequential scans are priced out for this one EXPLAIN: on a small table the planner would
    rightly prefer one, which says nothing about the table grown large. If it still picks one,
    no index can answer the query."""
    query = source.page_query(key_type, after=False)
    tx.execute("SET LOCAL enable_seqscan = off")
    try:
        plan = tx.scalar("EXPLAIN (FORMAT JSON) " + query, limit=batch)
    finally:
        tx.execute("SET LOCAL enable_seqscan = on")
    stamp = re.compile(rf"\b{source.stamp}\b")
    for node in _nodes(plan[0]["Plan"]):
        if node.get("Node Type") == "Seq Scan" or stamp.search(str(node.get("Filter", ""))):
            return False
    return True


PROBE = "onceflow_poll_probe"


def _a_defined_index_answers(tx: Tx, source: TableSource, batch: int, key_type: str) -> bool:
    """Whether a partial index led by the key answers the poll query by its definition, when
    the planner chose another path for this table as it is now: on a small table whose rows
    are all pending, walking the primary key and filtering costs about the same as the
    partial index (or less, if the partial index is the larger), which says nothing about
    the table once most rows are stamped.

    Each candidate's predicate, as Postgres deparses it, is put on an index of an empty
    temporary copy of the table (no other index there to prefer), and the same EXPLAIN asks
    the planner whether it can use it: the planner's own proof that the query's `where`
    implies the index's. The predicate text comes from the catalog (an index someone created
    on the table), never from a request; building an index on an empty table evaluates none
    of it. Only run when the EXPLAIN on the real table said no."""
    predicates = tx.all(
        "SELECT pg_get_expr(i.indpred, i.indrelid) AS predicate"
        " FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid"
        " JOIN pg_namespace n ON n.oid = c.relnamespace"
        " JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = i.indkey[0]"
        " WHERE n.nspname = :schema AND c.relname = :table AND a.attname = :key"
        " AND i.indpred IS NOT NULL AND i.indisvalid AND i.indisready"
        " ORDER BY c.oid",
        schema=source.schema,
        table=source.table,
        key=source.key,
    )
    if not predicates:
        return False
    probe = replace(source, schema="pg_temp", table=PROBE)
    # Dropped at the end (a second check in the same transaction makes it again), and on
    # commit in any case; a failure aborts the transaction, which takes it along.
    tx.execute(f"CREATE TEMPORARY TABLE {PROBE} (LIKE {source.qualified}) ON COMMIT DROP")
    answers = False
    for row in predicates:
        tx.execute(
            f"CREATE INDEX {PROBE}_index ON {probe.qualified} "
            f"({quote(source.key)}) WHERE {row['predicate']}"
        )
        answers = _index_answers(tx, probe, batch, key_type)
        tx.execute(f"DROP INDEX pg_temp.{PROBE}_index")
        if answers:
            break
    tx.execute(f"DROP TABLE {probe.qualified}")
    return answers


def _nodes(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield node
    for child in node.get("Plans", ()):
        yield from _nodes(child)
