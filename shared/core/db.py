"""Postgres access: one small pool per instance, transactions, and error translation.

Locally the server comes from `DATABASE_URL` (or the libpq `PG*` variables). In the cloud,
when `INSTANCE_CONNECTION_NAME` is set, connections come from cloud-sql-python-connector with
IAM database auth over private IP; the connector is created on first use and reused by every
later invocation of the instance (its constructor fetches credentials, so it must not run at
import time or on a laptop).

Every pg8000 error is translated here, by SQLSTATE, into `shared.core.errors`. A connection that
broke is dropped from the pool and replaced by a fresh one on the next checkout.

Named `Query` blocks run as server-side prepared statements, prepared once per pooled
connection (see `_Session`); ad hoc strings run as unnamed statements.
"""

from __future__ import annotations

import contextlib
import functools
import json
import queue
import socket
import struct
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import parse_qs, unquote, urlparse

import pg8000.core
import pg8000.dbapi
import pg8000.exceptions
from pg8000.converters import make_params

from shared.core.errors import (
    ConflictError,
    OnceflowError,
    PermanentError,
    TransientError,
    classify_sqlstate,
)
from shared.core.queries import Query
from shared.core.settings import DEFAULTS, Settings, settings, settings_from

T = TypeVar("T")
Row = dict[str, Any]
Connection = Any  # pg8000.dbapi.Connection; the driver ships no type information

# Threads of one process that may hold a pooled connection besides its request threads: the
# lease keeper where steps run (shared/steps/claim.py, `_LeaseKeeper`) or the webhook's nudge
# (shared/ingest/nudge.py). Each is one thread per process, and no function has both.
BACKGROUND_HOLDERS = 1


def pool_size_for(concurrency: int) -> int:
    """The pool an instance serving `concurrency` requests at once needs so that no checkout
    ever waits: a thread never holds two connections (`NestedCheckout`), so one per request
    thread plus one per background thread. Smaller would still never deadlock (nobody holds
    one while waiting for another) but would queue requests behind each other's
    transactions, and the lease keeper's renewal behind all of them. infra/ derives each
    function's DB_POOL_SIZE by the same rule (tests/test_infra.py checks it)."""
    return concurrency + BACKGROUND_HOLDERS


DEFAULT_POOL_SIZE = pool_size_for(1)
# How long a checkout waits for a free pooled connection before giving up (transient).
CHECKOUT_TIMEOUT_SECONDS = 30.0


@dataclass(frozen=True)
class SessionLimits:
    """Server-side limits set on every pooled connection when it is opened.

    Without them a statement stuck behind a lock, or a process frozen inside a transaction (a
    Cloud Run instance whose CPU is throttled after its response, a debugger), holds row locks
    for as long as the connection lives. Each limit ends the statement or the session with a
    SQLSTATE that `shared.core.errors` classifies as transient (57014, 55P03, 25P03), so the caller
    retries or Pub/Sub redelivers. 0 turns a limit off. Read once per pool from
    `DB_STATEMENT_TIMEOUT_MS`, `DB_LOCK_TIMEOUT_MS` and `DB_IDLE_IN_TRANSACTION_TIMEOUT_MS`."""

    statement_timeout_ms: int = DEFAULTS.db_statement_timeout_ms
    lock_timeout_ms: int = DEFAULTS.db_lock_timeout_ms
    idle_in_transaction_timeout_ms: int = DEFAULTS.db_idle_in_transaction_timeout_ms

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> SessionLimits:
        s = settings_from(env)
        return cls(
            statement_timeout_ms=s.db_statement_timeout_ms,
            lock_timeout_ms=s.db_lock_timeout_ms,
            idle_in_transaction_timeout_ms=s.db_idle_in_transaction_timeout_ms,
        )

    def statement(self) -> str:
        # Integers only (validated above), so formatting them into SET is safe.
        return (
            f"SET statement_timeout = {int(self.statement_timeout_ms)}; "
            f"SET lock_timeout = {int(self.lock_timeout_ms)}; "
            f"SET idle_in_transaction_session_timeout = "
            f"{int(self.idle_in_transaction_timeout_ms)}"
        )


# json and jsonb values arrive decoded: an object as a dict, an array as a list, a JSON string
# as a str, and so on (pg8000's default, pinned here so it is decided once). Readers of a
# jsonb column take the value as it comes and never `json.loads` it; a statement that wants
# the JSON text casts it to text. tests/test_db.py holds this.
JSON_TYPE_OIDS = (114, 3802)  # json, jsonb


def decode_json(conn: Connection) -> None:
    for oid in JSON_TYPE_OIDS:
        conn.register_in_adapter(oid, json.loads)


class NestedCheckout(PermanentError):
    """A thread asked the pool for a second connection while it already holds one.

    That is hold-and-wait: with N threads and a pool of N, every thread can hold one and wait
    for another, and nobody ever gets one (this is how concurrent admissions in one local
    functions-framework process once stalled for the 30 s checkout timeout). The pool refuses
    it at once, in every environment, so the bug shows in the first test that reaches it
    instead of as a rare stall under load. Work that must outlive a transaction's rollback
    runs after it, on the same connection, or in the same transaction."""


def translate(exc: BaseException) -> OnceflowError:
    """A driver or socket error as the onceflow error a caller should handle."""
    if isinstance(exc, OnceflowError):
        return exc
    if (
        isinstance(exc, pg8000.exceptions.DatabaseError)
        and exc.args
        and isinstance(exc.args[0], dict)
    ):
        fields: dict[str, str] = exc.args[0]
        sqlstate = fields.get("C")
        message = f"{fields.get('M', 'database error')} (SQLSTATE {sqlstate})"
        cls = classify_sqlstate(sqlstate)
        if cls is ConflictError:
            return ConflictError(message, constraint=fields.get("n"))
        return cls(message)
    if isinstance(exc, pg8000.exceptions.InterfaceError | OSError | struct.error | EOFError):
        return TransientError(f"database connection lost: {exc}")
    return PermanentError(f"database error: {exc!r}")


def _sqlstate(exc: BaseException) -> str | None:
    if (
        isinstance(exc, pg8000.exceptions.DatabaseError)
        and exc.args
        and isinstance(exc.args[0], dict)
    ):
        return str(exc.args[0].get("C", ""))
    return None


def _is_connection_broken(exc: BaseException) -> bool:
    if isinstance(exc, pg8000.exceptions.InterfaceError | OSError | struct.error | EOFError):
        return True
    code = _sqlstate(exc)
    return code is not None and (code.startswith("08") or code in {"57P01", "57P02", "57P03"})


class _Session:
    """A pooled connection and the statements prepared on it, which live and die together.

    pg8000's unnamed-statement path costs three network round trips per statement
    (Parse+Sync, Describe+Sync, Bind+Execute+Sync) and Postgres plans it afresh every time;
    a statement prepared once on this connection then costs one round trip per execution
    (Bind+Execute+Sync). Only `Query` blocks are prepared: there are finitely many of them,
    whereas ad hoc strings (tests, EXPLAIN) could grow the cache without bound.

    Parameter types are not pinned: pg8000 sends values as text with no type OIDs (unless
    given `types`, which we never do), so Postgres infers them from the statement exactly as
    for an unnamed statement, and a None now and a value later bind to the same prepared
    statement. `prepare_statement`/`execute_named` are the core methods pg8000's own
    `native.PreparedStatement` uses (pg8000 is pinned in requirements.txt).
    """

    def __init__(self, conn: Connection, generation: int, counter: RoundTrips) -> None:
        self.conn = conn
        self.counter = counter
        # The pool's plan generation when this connection was opened (see `_StalePlan`).
        self.generation = generation
        self._prepared: dict[str, tuple[bytes, Any, Any]] = {}

    def run(
        self,
        statement: str,
        values: tuple[Any, ...],
        *,
        prepare: bool,
        begin: bool = False,
        commit: bool = False,
        ahead: tuple[tuple[str, tuple[Any, ...]], ...] = (),
    ) -> Any:
        """Execute one statement; `begin`: open the transaction first, `commit`: commit it
        right after; `ahead`: statements whose answers nobody reads, run first in the same
        round trip once all are prepared on this connection (before: one by one). For a
        prepared statement BEGIN and COMMIT travel in the statement's own round trip
        (pipelined: BEGIN, Bind+Execute+Sync, COMMIT written together, answers read in
        order). A COMMIT that follows a failed statement is answered ROLLBACK by the server,
        so pipelining it never commits a failure: the statement's error is what is raised."""
        conn = self.conn
        if ahead:
            return self._run_with_ahead(
                statement, values, prepare=prepare, begin=begin, commit=commit, ahead=ahead
            )
        if not prepare:
            if begin:
                conn.execute_simple("BEGIN")
                self.counter.add()
            self.counter.add(3)  # Parse, Describe, Bind+Execute: each waits for its answer
            ctx = conn.execute_unnamed(statement, vals=values)
            if commit:
                conn.execute_simple("COMMIT")
                self.counter.add()
            return ctx
        prepared = self._prepared.get(statement)
        if prepared is None:
            if begin:  # the Parse runs inside the transaction, like every later execution
                conn.execute_simple("BEGIN")
                self.counter.add_setup()  # paid with the Parse, once per connection
                begin = False
            # A statement that fails to prepare raises here, exactly as the unnamed Parse
            # did, and is not cached.
            self.counter.add_setup()  # Parse+Describe, once per connection
            prepared = conn.prepare_statement(statement, ())
            self._prepared[statement] = prepared
        self.counter.add()  # BEGIN and COMMIT, when asked for, travel in this round trip
        name, columns, input_funcs = prepared
        params = make_params(conn.py_types, values)
        try:
            if not (begin or commit):
                return conn.execute_named(name, params, columns, input_funcs, statement)
            return self._pipelined(
                prepared, params, statement=statement, begin=begin, commit=commit
            )
        except pg8000.exceptions.DatabaseError as exc:
            # 0A000 alone also covers unrelated "feature not supported" errors, which must
            # stay permanent; the routine names the plan cache's revalidation.
            if _sqlstate(exc) == "0A000" and exc.args[0].get("R") == "RevalidateCachedQuery":
                raise _StalePlan(f"{translate(exc)}; retrying on fresh connections") from exc
            raise

    def _run_with_ahead(
        self,
        statement: str,
        values: tuple[Any, ...],
        *,
        prepare: bool,
        begin: bool,
        commit: bool,
        ahead: tuple[tuple[str, tuple[Any, ...]], ...],
    ) -> Any:
        """`run` with statements ahead of it (see there)."""
        conn = self.conn
        ready = [self._prepared.get(s) for s, _ in ahead]
        main = self._prepared.get(statement)
        if not prepare or main is None or any(r is None for r in ready):
            for s, v in ahead:  # first use on this connection: one by one
                self.run(s, v, prepare=True, begin=begin)
                begin = False
            return self.run(statement, values, prepare=prepare, begin=begin, commit=commit)
        self.counter.add()
        leading = [
            (r, make_params(conn.py_types, v), s)
            for r, (s, v) in zip(ready, ahead, strict=True)
            if r is not None
        ]
        try:
            return self._pipelined(
                main,
                make_params(conn.py_types, values),
                statement=statement,
                begin=begin,
                commit=commit,
                ahead=leading,
            )
        except pg8000.exceptions.DatabaseError as exc:
            if _sqlstate(exc) == "0A000" and exc.args[0].get("R") == "RevalidateCachedQuery":
                raise _StalePlan(f"{translate(exc)}; retrying on fresh connections") from exc
            raise

    def _pipelined(
        self,
        prepared: tuple[bytes, Any, Any],
        params: Any,
        *,
        statement: str,
        begin: bool,
        commit: bool,
        ahead: list[tuple[tuple[bytes, Any, Any], Any, str]] | None = None,
    ) -> Any:
        # pg8000's own execute_named, with the BEGIN / COMMIT queries (and the statements
        # `ahead` of it) written into the same flush (the core methods it is built from;
        # pg8000 is pinned in requirements.txt).
        conn = self.conn
        sock = conn._sock
        name, columns, input_funcs = prepared
        ctx = pg8000.core.Context(columns=columns, input_funcs=input_funcs, statement=statement)
        if begin:
            conn.send_QUERY("BEGIN")
        leading = []
        for (a_name, a_columns, a_funcs), a_params, a_statement in ahead or ():
            conn.send_BIND(a_name, a_params)
            conn.send_EXECUTE()
            pg8000.core._write(sock, pg8000.core.SYNC_MSG)
            leading.append(
                pg8000.core.Context(columns=a_columns, input_funcs=a_funcs, statement=a_statement)
            )
        conn.send_BIND(name, params)
        conn.send_EXECUTE()
        pg8000.core._write(sock, pg8000.core.SYNC_MSG)
        if commit:
            conn.send_QUERY("COMMIT")
        pg8000.core._flush(sock)
        # Every answer is read, even after an error, so the connection stays in step.
        failure: pg8000.exceptions.Error | None = None
        for context in (
            ([pg8000.core.Context("BEGIN")] if begin else [])
            + leading
            + [ctx]
            + ([pg8000.core.Context("COMMIT")] if commit else [])
        ):
            try:
                conn.handle_messages(context)
            except pg8000.exceptions.Error as exc:
                # After a failed statement the COMMIT is a ROLLBACK (pg8000 flags it as "in
                # failed transaction block"): the first error is the one that happened.
                failure = failure or exc
        if failure is not None:
            raise failure
        return ctx


class TransactionLost(TransientError):
    """A savepoint could not contain a failure: the connection broke, a prepared statement
    went stale, or ROLLBACK TO SAVEPOINT itself failed. The whole transaction is gone; the
    caller must let this propagate to `Database.transaction` (which discards the connection
    or the stale plans) rather than carry on in it."""


class _StalePlan(TransactionLost):
    """Postgres refused a prepared statement whose result columns changed since it was
    prepared (0A000 "cached plan must not change result type": a migration altered a table
    it reads). The transaction is aborted by then, so it cannot be re-prepared in place:
    every connection of the pool prepared before this is discarded (the others very likely
    hold stale statements too) and the transaction is retried as a transient error."""


class Tx:
    """One open transaction. Statements are named `Query` blocks with `:name` parameters."""

    def __init__(self, session: _Session) -> None:
        self._session = session
        self._counter = session.counter
        self._savepoints = 0
        # BEGIN is sent with the first statement (never alone: it can't fail, and a round
        # trip of its own was a quarter of a short transaction's); `finished` once a
        # statement committed or rolled back the transaction itself (`commit_with`).
        self.begun = False
        self.finished = False
        # Writes whose answer nobody reads, sent with the COMMIT (`at_commit`).
        self._at_commit: list[tuple[Query, Mapping[str, Any]]] = []
        # Statements whose answer nobody reads, sent with the next one (`ahead`).
        self._ahead: list[tuple[Query, Mapping[str, Any]]] = []

    @contextmanager
    def savepoint(self) -> Iterator[None]:
        """A unit inside the transaction that can fail alone: on an error its writes are
        rolled back (ROLLBACK TO SAVEPOINT), the error is raised translated (shared.core.errors),
        and the transaction goes on. A failure the savepoint can't contain raises
        `TransactionLost`. Simple-protocol statements: one round trip each."""
        conn = self._session.conn
        self._check_open()
        self._savepoints += 1
        name = f"sp{self._savepoints}"
        conn.execute_simple(("" if self.begun else "BEGIN; ") + f"SAVEPOINT {name}")
        self.begun = True
        self._counter.add()
        try:
            yield
        except BaseException as exc:
            if isinstance(exc, _StalePlan):
                raise  # `transaction` discards the stale plans
            if _is_connection_broken(exc):
                raise TransactionLost(f"transaction lost: {translate(exc)}") from exc
            try:
                conn.execute_simple(f"ROLLBACK TO SAVEPOINT {name}")
                self._counter.add()
            except Exception as rollback_exc:
                raise TransactionLost(
                    f"transaction lost: {translate(rollback_exc)} (after {exc!r})"
                ) from exc
            if isinstance(exc, Exception):
                raise translate(exc) from exc
            raise
        conn.execute_simple(f"RELEASE SAVEPOINT {name}")
        self._counter.add()

    def _check_open(self) -> None:
        if self.finished:
            raise PermanentError("this transaction was already committed by commit_with")

    def ahead(self, query: Query, **params: Any) -> None:
        """Queue a statement whose answer nobody reads, to run right before the next one, in
        the same round trip (issue 27: the budget's lock rides with the reservation). If it
        fails, the next one fails with it and its error is raised there."""
        self._check_open()
        self._ahead.append((query, params))

    def _run(self, query: Query | str, params: Mapping[str, Any], *, commit: bool = False) -> Any:
        self._check_open()
        statement, values = _bound(query, params)
        if self._ahead:
            queued, self._ahead = self._ahead, []
            ahead = tuple(_bound(q, p) for q, p in queued)
            begin, self.begun = not self.begun, True
            self.finished = commit
            return self._session.run(
                statement,
                values,
                prepare=isinstance(query, Query),
                begin=begin,
                commit=commit,
                ahead=ahead,
            )
        begin = not self.begun
        if commit:
            # Whatever happens next, the server ends the transaction (COMMIT, or ROLLBACK
            # after a failed statement): nothing may run in it any more.
            self.finished = True
            if begin:
                # The first statement is also the last: on the autocommit connection it is a
                # transaction by itself, so neither BEGIN nor COMMIT is sent (the server then
                # has one command to run, not three: measured faster on the step path).
                return self._session.run(statement, values, prepare=isinstance(query, Query))
        self.begun = True
        return self._session.run(
            statement, values, prepare=isinstance(query, Query), begin=begin, commit=commit
        )

    def at_commit(self, query: Query, **params: Any) -> None:
        """Queue a write whose answer nobody reads; it is sent when the transaction commits,
        the last one in the same round trip as the COMMIT (one statement alone in its
        transaction: on its own, no BEGIN or COMMIT). If it fails, the transaction rolls
        back and its error is raised from the `transaction` block. For a write that must be
        durable with the rest but decides nothing (issue 27: the echo marker that rides with
        the gates' commit)."""
        self._check_open()
        self._at_commit.append((query, params))

    def _send_at_commit(self) -> None:
        queued, self._at_commit = self._ahead + self._at_commit, []
        self._ahead = []
        for i, (query, params) in enumerate(queued):
            self._run(query, params, commit=i == len(queued) - 1)

    def commit_with(self, query: Query | str, **params: Any) -> list[Row]:
        """Run the transaction's last statement and COMMIT in the same round trip; its rows.
        If the statement fails, the transaction is rolled back and its error raised; any
        statement after this one raises. For a transaction whose last statement is known; a
        transaction of that one statement alone sends no BEGIN or COMMIT at all. Writes queued
        by `at_commit` are sent first, so they commit with it."""
        queued, self._at_commit = self._at_commit, []
        for queued_query, queued_params in queued:
            self._run(queued_query, queued_params)
        return self._rows(self._run(query, params, commit=True))

    @staticmethod
    def _rows(ctx: Any) -> list[Row]:
        if ctx.rows is None:
            return []
        names = [c["name"] for c in ctx.columns]
        return [dict(zip(names, r, strict=True)) for r in ctx.rows]

    def all(self, query: Query | str, **params: Any) -> list[Row]:
        return self._rows(self._run(query, params))

    def one(self, query: Query | str, **params: Any) -> Row | None:
        rows = self.all(query, **params)
        return rows[0] if rows else None

    def scalar(self, query: Query | str, **params: Any) -> Any:
        ctx = self._run(query, params)
        if not ctx.rows:
            return None
        return ctx.rows[0][0]

    def execute(self, query: Query | str, **params: Any) -> int:
        """Run a statement; the number of rows it touched (zero is an answer, not an error)."""
        ctx = self._run(query, params)
        return int(ctx.row_count) if ctx.row_count is not None and ctx.row_count >= 0 else 0


def _bound(query: Query | str, params: Mapping[str, Any]) -> tuple[str, tuple[Any, ...]]:
    """The statement in `$n` form and its values in order."""
    text = query.text if isinstance(query, Query) else query
    statement, names = _converted(text)
    values = tuple(_text_array(v) if type(v) is list else v for v in map(params.__getitem__, names))
    return statement, values


class _NameRecorder(dict[str, Any]):
    """Answers every lookup with the parameter's own name, to record the placeholder order."""

    def __missing__(self, key: str) -> str:
        return key


@functools.lru_cache(maxsize=1024)
def _converted(text: str) -> tuple[str, tuple[str, ...]]:
    """`:name` → `$n` once per statement text: pg8000 scans the text character by character
    in Python (milliseconds for a long commented statement, holding the GIL), so redoing it
    on every execution was the largest CPU cost of a short transaction."""
    statement, names = pg8000.dbapi.convert_paramstyle("named", text, _NameRecorder())
    return statement, tuple(names)


def _text_array(values: list[Any]) -> Any:
    """A flat list of str/None as an array literal, built with C-speed string operations:
    pg8000 escapes array elements one character at a time in Python, which was the largest
    CPU cost of admitting an event with 50 bindings (8 arrays of 50). Every element is
    quoted, so each reads back exactly as given (pg8000 left "null" unquoted, which Postgres
    reads as NULL). Any other list (numbers, nested lists, uuid.UUID…) goes to pg8000."""
    parts = []
    for v in values:
        if type(v) is str:
            parts.append('"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"')
        elif v is None:
            parts.append("NULL")
        else:
            return values
    return "{" + ",".join(parts) + "}"


class RoundTrips:
    """Counts network exchanges with the server per thread (each message batch that waits
    for its answer), so benchmarks can report round trips per unit honestly. `count`: what a
    unit of work pays every time — each statement, BEGIN, COMMIT and ROLLBACK one, an ad hoc
    (unnamed) statement three (Parse, Describe, Bind+Execute each wait for an answer).
    `setup`: what a pooled connection pays once — its session SET and each named block's
    Parse on it. Only the connection's startup and authentication are not counted."""

    def __init__(self) -> None:
        self._local = threading.local()

    def add(self, n: int = 1) -> None:
        self._local.count = getattr(self._local, "count", 0) + n

    def add_setup(self, n: int = 1) -> None:
        self._local.setup = getattr(self._local, "setup", 0) + n

    @property
    def count(self) -> int:
        return int(getattr(self._local, "count", 0))

    @property
    def setup(self) -> int:
        return int(getattr(self._local, "setup", 0))

    def reset(self) -> None:
        self._local.count = 0
        self._local.setup = 0


class _Pin:
    """A thread's pinned connection (`Database.pinned`); None once it broke and was dropped."""

    def __init__(self, session: _Session) -> None:
        self.session: _Session | None = session
        self.in_transaction = False

    def enter(self, fresh: Callable[[], _Session]) -> _Session:
        """The session for a transaction about to open on the pin (a fresh one after a
        breakage dropped the last)."""
        if self.in_transaction:
            raise NestedCheckout(
                "this thread already has a transaction open on its pinned connection; "
                "a second one at once is hold-and-wait"
            )
        session = self.session if self.session is not None else fresh()
        self.session, self.in_transaction = session, True
        return session


class Database:
    """A bounded pool of pg8000 connections (LIFO, so warm connections are reused)."""

    def __init__(
        self,
        connect: Callable[[], Connection],
        pool_size: int = DEFAULT_POOL_SIZE,
        *,
        limits: SessionLimits | None = None,
    ):
        if pool_size < 1:
            raise PermanentError(f"a database pool needs at least 1 connection, not {pool_size}")
        self._connect = connect
        self._idle: queue.LifoQueue[_Session] = queue.LifoQueue()
        self._slots = threading.BoundedSemaphore(pool_size)
        self.pool_size = pool_size
        self.limits = limits or SessionLimits.from_env()
        self.round_trips = RoundTrips()
        # Bumped when a prepared statement went stale; older sessions are discarded.
        self._generation = 0
        # Which threads hold a connection of this pool right now (see NestedCheckout).
        self._holding = threading.local()
        # Pool pressure (tests and benches read it): checkouts that found every connection
        # taken and had to wait, and the most connections held at once. With a pool of
        # pool_size_for(threads) `waited` stays 0.
        self.waited = 0
        self.peak_in_use = 0
        self._in_use = 0
        self._pressure_lock = threading.Lock()

    def _checkout(self) -> _Session:
        if getattr(self._holding, "held", False):
            raise NestedCheckout(
                "this thread already holds a connection from this pool; taking a second one "
                "is hold-and-wait and can deadlock the pool under concurrency"
            )
        if not self._slots.acquire(blocking=False):
            with self._pressure_lock:
                self.waited += 1
            if not self._slots.acquire(timeout=CHECKOUT_TIMEOUT_SECONDS):
                raise TransientError("no database connection free in this instance's pool")
        with self._pressure_lock:
            self._in_use += 1
            self.peak_in_use = max(self.peak_in_use, self._in_use)
        self._holding.held = True
        try:
            return self._take_session()
        except BaseException:
            self._release_slot()
            raise

    def _take_session(self) -> _Session:
        while True:
            try:
                session = self._idle.get_nowait()
            except queue.Empty:
                break
            if session.generation == self._generation:
                return session
            _close_quietly(session.conn)  # its prepared statements may be stale
        conn = None
        try:
            conn = self._connect()
            conn.autocommit = True  # transactions are opened explicitly by `transaction()`
            decode_json(conn)
            conn.execute_simple(self.limits.statement())
            self.round_trips.add_setup()
            return _Session(conn, self._generation, self.round_trips)
        except BaseException as exc:
            if conn is not None:
                _close_quietly(conn)
            raise translate(exc) from exc

    def _checkin(self, session: _Session | None) -> None:
        if session is not None:
            self._idle.put(session)
        self._release_slot()

    def _release_slot(self) -> None:
        with self._pressure_lock:
            self._in_use -= 1
        self._holding.held = False
        self._slots.release()

    @contextmanager
    def pinned(self) -> Iterator[Database]:
        """Hold one pooled connection for this thread until the block ends: every
        `transaction` this thread opens on this pool meanwhile runs on it, one after the
        other (issue 27: one connection per step, from the claim to the settle). A
        transaction opened inside another on the same thread is refused (`NestedCheckout`),
        as without a pin. A connection that broke is replaced by a fresh one for the next
        transaction, still under the same slot. Re-entrant: an inner `pinned` changes
        nothing. Other threads (the lease keeper) still take their own connections."""
        if getattr(self._holding, "pin", None) is not None:
            yield self
            return
        pin = _Pin(self._checkout())
        self._holding.pin = pin
        try:
            yield self
        finally:
            self._holding.pin = None
            self._checkin(pin.session)

    @contextmanager
    def transaction(self) -> Iterator[Tx]:
        """BEGIN … COMMIT on a pooled connection (this thread's pinned one, see `pinned`);
        any error rolls back and is translated. BEGIN travels with the first statement; a
        transaction that sent none sends nothing, and one ended by `Tx.commit_with` has
        nothing left to commit."""
        pin: _Pin | None = getattr(self._holding, "pin", None)
        session = self._checkout() if pin is None else pin.enter(self._take_session)
        conn = session.conn
        keep: _Session | None = session
        tx = Tx(session)
        try:
            yield tx
            if tx._at_commit:
                tx._send_at_commit()
            if tx.begun and not tx.finished:
                tx.finished = True
                conn.execute_simple("COMMIT")
                self.round_trips.add()
        except BaseException as exc:
            if isinstance(exc, _StalePlan):
                self._generation += 1
            if _is_connection_broken(exc) or isinstance(exc, TransactionLost):
                keep = None
                _close_quietly(conn)
            elif tx.begun:
                # Also after `commit_with`: its statement may have failed before the COMMIT
                # was sent (a failed Parse). With no transaction open this is only a warning.
                try:
                    self.round_trips.add()
                    conn.execute_simple("ROLLBACK")
                except Exception:
                    keep = None
                    _close_quietly(conn)
            if isinstance(exc, Exception):
                raise translate(exc) from exc
            raise
        finally:
            if pin is None:
                self._checkin(keep)
            else:
                pin.session, pin.in_transaction = keep, False

    def run(self, work: Callable[[Tx], T], *, attempts: int = 3) -> T:
        """`work` in a transaction, retried on transient errors (it must be safe to repeat)."""
        for attempt in range(1, attempts + 1):
            try:
                with self.transaction() as tx:
                    return work(tx)
            except TransientError:
                if attempt == attempts:
                    raise
        raise AssertionError("unreachable")

    def close(self) -> None:
        while True:
            try:
                _close_quietly(self._idle.get_nowait().conn)
            except queue.Empty:
                return


def _close_quietly(conn: Connection) -> None:
    # The connection is being discarded; an error closing it changes nothing.
    with contextlib.suppress(Exception):
        conn.close()


def connect_kwargs_from_env(env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """pg8000 keyword arguments from DATABASE_URL, falling back to the libpq PG* variables."""
    s = settings_from(env)
    if s.database_url:
        return parse_database_url(s.database_url)
    kwargs: dict[str, Any] = {
        "user": s.pg_user,
        "database": s.pg_database,
        "host": s.pg_host,
        "port": s.pg_port,
    }
    if s.pg_password:
        kwargs["password"] = s.pg_password
    return kwargs


def parse_database_url(url: str) -> dict[str, Any]:
    """`postgresql://user:pass@host:port/db` (a `?host=/dir` query selects a unix socket;
    `?application_name=x` names the connections in pg_stat_activity, as with libpq)."""
    parsed = urlparse(url)
    if parsed.scheme not in ("postgres", "postgresql"):
        raise PermanentError(f"DATABASE_URL must start with postgresql://, got {parsed.scheme}://")
    query = parse_qs(parsed.query)
    kwargs: dict[str, Any] = {
        "user": unquote(parsed.username or "postgres"),
        "database": unquote(parsed.path.lstrip("/") or "postgres"),
    }
    if parsed.password:
        kwargs["password"] = unquote(parsed.password)
    if query.get("application_name"):
        kwargs["application_name"] = query["application_name"][0]
    socket_dir = query.get("host", [None])[0]
    port = parsed.port or 5432
    if socket_dir and socket_dir.startswith("/"):
        kwargs["unix_sock"] = f"{socket_dir}/.s.PGSQL.{port}"
    else:
        kwargs["host"] = parsed.hostname or "127.0.0.1"
        kwargs["port"] = port
    return kwargs


_cloud_connector: Any = None
_cloud_connector_lock = threading.Lock()


def _connect_cloud_sql(instance: str, s: Settings) -> Connection:
    """A connection through the Cloud SQL connector (IAM auth, private IP, lazy refresh)."""
    global _cloud_connector  # noqa: PLW0603 - one connector per instance, created on first use
    with _cloud_connector_lock:
        if _cloud_connector is None:
            from google.cloud.sql.connector import Connector

            _cloud_connector = Connector(refresh_strategy="lazy")
    conn: Connection = _cloud_connector.connect(
        instance,
        "pg8000",
        user=s.db_iam_user,
        db=s.db_name,
        enable_iam_auth=True,
        ip_type=s.db_ip_type,
    )
    _tune_socket(conn)
    return conn


def connector_from_env(env: Mapping[str, str] | None = None) -> Callable[[], Connection]:
    s = settings_from(env)
    instance = s.instance_connection_name
    if instance:
        return lambda: _connect_cloud_sql(instance, s)
    kwargs = connect_kwargs_from_env(env)
    # pg8000's `timeout` is the socket's, for every read, not only the connect: a statement
    # still legitimately running when it fires breaks the connection. It must outlast the
    # server-side statement_timeout, which ends a long statement cleanly (57014) first.
    limit_ms = s.db_statement_timeout_ms
    socket_timeout = max(10.0, limit_ms / 1000 + 5) if limit_ms else 300.0

    def connect() -> Connection:
        conn = pg8000.dbapi.connect(timeout=socket_timeout, **kwargs)
        _tune_socket(conn)
        return conn

    return connect


def _tune_socket(conn: Connection) -> None:
    """TCP options pg8000 doesn't set (libpq sets TCP_NODELAY; pg8000 leaves Nagle on).

    TCP_NODELAY: pg8000 writes through an 8 KiB buffer, so a message larger than that (the
    admission statement's arrays at 50 bindings, a step's large input or output) leaves in
    two writes; with Nagle on, the second waits for the server to ACK the first, and the
    server delays that ACK (~40 ms on Linux) because the message isn't complete yet. Measured
    at 50 bindings: the admit statement took 52 ms per event instead of 8.
    SO_KEEPALIVE: a silently dropped connection is noticed instead of hanging."""
    sock = getattr(conn, "_usock", None)
    if isinstance(sock, socket.socket) and sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


_database: Database | None = None
_database_lock = threading.Lock()


def get_database() -> Database:
    """The process-wide pool, created on first use and reused across invocations."""
    global _database  # noqa: PLW0603 - reused across invocations of a warm instance
    with _database_lock:
        if _database is None:
            _database = Database(connector_from_env(), pool_size=settings().db_pool_size)
        return _database


def reset_database() -> None:
    """Forget the process-wide pool (tests that point DATABASE_URL elsewhere)."""
    global _database  # noqa: PLW0603
    with _database_lock:
        if _database is not None:
            _database.close()
        _database = None
