"""CRM blocks: crm.create (at-most-once), crm.update (idempotent, echo-marked), crm.get and
crm.search (reads). They talk to the connection's `CrmPort`, never to a vendor.

Before `execute` runs, the step executor has run the gates every CRM block declares
(`PROVIDER_GATES`: the connection's and the workflow's rate limits, the charge of the spec's
price; shared/gates/catalog.py), keyed on the connection `connection_target` resolves (and
whose port it builds, so a misconfigured connection fails before any slot or credit is taken).
A rehearsal runs no gate. Then, in a writing block:
1. dry run: stop here and describe the request (rehearsals never touch a provider).
2. the port (cached per connection).
5. crm.create: set `side_effect_started_at` WHERE NULL (committed). Finding it set means an
   earlier attempt may have created the record: fail `OUTCOME_UNKNOWN`, never call again —
   unless the port declares write idempotency (the connection has a unique-value property for
   onceflow's key, stamped with the step's idempotency key on every try): then it creates again.
   With the key, a 409 "Existing ID: N" is adopted (outcome `ADOPTED_EXISTING`, output
   `adopted_existing: N`) only when record N carries this step's own key — the record a lost
   try of this step (or of an earlier run of its lineage: a replay has the same key) made —
   whether or not the mark was set; read back to be sure, since the 409 names whichever unique
   value clashed (a contact's email names someone else's contact: `ALREADY_EXISTS`).
   crm.update: an echo marker, so the webhook the write causes is refused — committed with
   the gates, before the call (`update_echo`, the spec's `before_call`).
6. call the port; classify its `PortError` into a `BlockFailure`.
7. crm.create: record echo markers for the properties it set, now that the record has an id
   (the provider sends a propertyChange for each; see shared/ingest/echo.py for the timing).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, field_validator

from shared.blocks.base import (
    PROVIDER_GATES,
    BlockContext,
    BlockFailure,
    BlockResult,
    BlockSpec,
    LandedQuery,
    RetryPolicy,
    SideEffect,
    Target,
    dry_run_result,
)
from shared.core.db import Tx
from shared.core.logs import get_logger
from shared.ingest import echo
from shared.port.interface import (
    NOT_APPLIED_CODES,
    Association,
    CrmPort,
    PortError,
    Record,
    SearchFilter,
    plural_object_type,
    singular_object_type,
)
from shared.providers import connect, kinds, registry

Scalar = str | int | float | bool | None
ECHO_TTL_SECONDS = 600
log = get_logger(__name__)
_T = TypeVar("_T")
ACTION_RETRY = RetryPolicy()

# Same code as shared.steps.outcomes.OUTCOME_UNKNOWN: the step engine's word for "a side effect
# may have left and its result was never recorded".
OUTCOME_UNKNOWN = "OUTCOME_UNKNOWN"
OUTCOME_NO_CONNECTION = "NO_CONNECTION"
OUTCOME_ALREADY_EXISTS = "ALREADY_EXISTS"
OUTCOME_ADOPTED_EXISTING = "ADOPTED_EXISTING"
# Vendor-neutral port codes → step outcome codes.
_PORT_OUTCOMES = {
    "rate_limited": "PROVIDER_RATE_LIMITED",
    "busy": "PROVIDER_BUSY",
    "unavailable": "PROVIDER_UNAVAILABLE",
    "timeout": "PROVIDER_TIMEOUT",
    "connection_reset": "PROVIDER_CONNECTION_RESET",
    "connect_failed": "PROVIDER_UNREACHABLE",
    "conflict": OUTCOME_ALREADY_EXISTS,
    "not_found": "RECORD_NOT_FOUND",
    "unauthorized": "PROVIDER_UNAUTHORIZED",
    "invalid_request": "PROVIDER_REJECTED",
}


class _Config(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    object_type: str = Field(
        description="contact, company, deal, task or note (or plural), or the connection's "
        "provider's own name for one (e.g. person, organization, activity)."
    )
    connection_id: str | None = Field(
        default=None, description="Defaults to the connection the trigger came from."
    )

    @field_validator("object_type")
    @classmethod
    def _a_kind(cls, value: str) -> str:
        return _known_kind(value)


def _known_kind(value: str) -> str:
    """A config's object type names a kind on some CRM (validation, without the connection:
    the step itself resolves it on its connection's provider, `_object_type`)."""
    if registry.object_kind(value) is None:
        raise ValueError(f"{value!r} is no object kind: use {registry.object_kind_names()}")
    return value


class AssociationConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    object_type: str = Field(
        description="The existing record's kind (contact, company, deal, …, or the provider's "
        "own name)."
    )
    id: str = Field(min_length=1, description="The existing record's id.")
    type_id: int | None = Field(
        default=None, description="Provider association type; default: the provider's for the pair."
    )

    @field_validator("object_type")
    @classmethod
    def _a_kind(cls, value: str) -> str:
        return _known_kind(value)


class CreateConfig(_Config):
    properties: dict[str, Scalar] = Field(min_length=1)
    associations: list[AssociationConfig] = Field(
        default_factory=list,
        description="Existing records to link the new one to (a HubSpot task shows on a record "
        "only when associated with it).",
    )


class UpdateConfig(_Config):
    object_id: str = Field(min_length=1)
    properties: dict[str, Scalar] = Field(min_length=1)
    echo_ttl_seconds: int = Field(default=ECHO_TTL_SECONDS, ge=10, le=86_400)


class GetConfig(_Config):
    object_id: str = Field(min_length=1)
    properties: list[str] = Field(default_factory=list)


class FilterConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    property: str
    operator: str = "EQ"
    value: Scalar = None


class SearchConfig(_Config):
    filters: list[FilterConfig] = Field(default_factory=list)
    limit: int = Field(default=10, ge=1, le=100)


def failure_from_port(exc: PortError, *, what: str) -> BlockFailure:
    outcome = _PORT_OUTCOMES.get(exc.code, "PROVIDER_ERROR")
    detail = f"{what}: {exc}"
    if exc.existing_id:
        detail += f" (existing id {exc.existing_id})"
    return BlockFailure(
        detail,
        error_class="transient" if exc.transient else "permanent",
        outcome_code=outcome,
        retry_after=exc.retry_after,
        not_applied=exc.code in NOT_APPLIED_CODES,
    )


def _connection_id(ctx: BlockContext, config: _Config) -> str:
    connection_id = config.connection_id or ctx.connection_id
    if not connection_id:
        raise BlockFailure(
            "no connection: set config.connection_id or trigger from a connection",
            error_class="permanent",
            outcome_code=OUTCOME_NO_CONNECTION,
        )
    return connection_id


def _port(ctx: BlockContext, connection_id: str) -> CrmPort:
    """The connection's port, its row read on the step's connection (`ctx.db`)."""
    try:
        return connect.port_for(ctx.database(), connection_id)
    except PortError as exc:
        raise failure_from_port(exc, what=f"connection {connection_id}") from exc


def _object_type(ctx: BlockContext, config: _Config, name: str | None = None) -> str:
    """The neutral kind (plural, as the port takes it) that `name` (default: the config's
    `object_type`) means on the step's connection: a neutral kind or its provider's own name
    for one (registry.object_kind); without a connection, any CRM provider's. The port's
    adapter turns it into its vendor's name."""
    name = config.object_type if name is None else name
    provider = kinds.provider_of(ctx.db, config.connection_id or ctx.connection_id)
    kind = registry.object_kind(name, provider)
    try:
        return plural_object_type(kind or name)
    except PortError as exc:
        raise failure_from_port(exc, what="config") from exc


def _output(record: Record) -> dict[str, Any]:
    return {"id": record.id, "object_type": record.object_type, "properties": record.properties}


def connection_target(ctx: BlockContext, config: BaseModel) -> Target:
    """What the gates key on: the step's connection, whose port is built here so that a
    misconfigured connection is refused before a slot or a credit is taken."""
    assert isinstance(config, _Config)
    connection_id = _connection_id(ctx, config)
    port = _port(ctx, connection_id)
    # Known from here on (read once per process), so that naming the config's kind later —
    # in the gates' transaction too (`update_echo`) — never opens a transaction of its own.
    kinds.provider_of(ctx.db, connection_id)
    return Target(connection_id=connection_id, port=port)


def _connect(ctx: BlockContext, config: _Config) -> tuple[str, CrmPort]:
    """The connection and its port. The gates ran before the block (a rehearsal's read runs
    none: it claims no live slot and is charged nothing, invariant 13)."""
    connection_id = _connection_id(ctx, config)
    target = ctx.target
    if target is not None and target.port is not None and target.connection_id == connection_id:
        return connection_id, target.port  # built by `connection_target` for this attempt
    return connection_id, _port(ctx, connection_id)


# --- crm.create ---------------------------------------------------------------------------------
def execute_create(ctx: BlockContext, config: BaseModel) -> BlockResult:
    assert isinstance(config, CreateConfig)
    object_type = _object_type(ctx, config)
    if ctx.dry_run:
        stand_in = Record(object_type, f"dry-run:{ctx.idempotency_key}", config.properties)
        return dry_run_result(
            "crm.create", _output(stand_in), object_type=object_type, properties=config.properties
        )
    connection_id, port = _connect(ctx, config)
    properties: dict[str, Scalar] = dict(config.properties)
    key_property = port.idempotency_property if port.capabilities.write_idempotency else None
    if key_property:
        properties[key_property] = ctx.idempotency_key
    associations = [
        Association(_object_type(ctx, config, a.object_type), a.id, a.type_id)
        for a in config.associations
    ]
    if not ctx.mark_side_effect_started():
        if key_property is None:
            raise BlockFailure(
                "an earlier attempt may already have created this record (its response was "
                "never recorded); not calling again. Check the CRM, then replay the run.",
                error_class="permanent",
                outcome_code=OUTCOME_UNKNOWN,
            )
        return _create_or_adopt(
            ctx,
            config=config,
            connection_id=connection_id,
            port=port,
            object_type=object_type,
            properties=properties,
            associations=associations,
        )
    try:
        made = _create_or_adopt_own(
            ctx,
            port,
            object_type=object_type,
            properties=properties,
            associations=associations,
            key_property=key_property,
        )
    except PortError as exc:
        if exc.code in NOT_APPLIED_CODES:
            # The provider provably did not create anything. For a retryable refusal, take the
            # mark back so the retry may call; if the engine can't, the retry fails safe.
            if exc.transient and not ctx.withdraw_side_effect_mark():
                raise BlockFailure(
                    f"create refused before it applied ({exc.code}); the at-most-once mark "
                    "could not be withdrawn, so the step will not call again",
                    error_class="permanent",
                    outcome_code=OUTCOME_UNKNOWN,
                ) from exc
            raise failure_from_port(exc, what="crm.create") from exc
        if key_property and exc.transient:
            # Unknown fate, but the key property makes a retry safe: it creates or adopts.
            raise failure_from_port(exc, what="crm.create") from exc
        # The request left and its fate is unknown (reset, timeout, 5xx): never call again.
        raise BlockFailure(
            f"crm.create outcome unknown after {exc.code}: {exc}. The record may exist; "
            "check the CRM, then replay the run.",
            error_class="permanent",
            outcome_code=OUTCOME_UNKNOWN,
        ) from exc
    if isinstance(made, BlockResult):
        return made
    _record_create_echo(ctx, config, connection_id, made)
    return BlockResult(output=_output(made))


def _create_or_adopt_own(
    ctx: BlockContext,
    port: CrmPort,
    *,
    object_type: str,
    properties: dict[str, Scalar],
    associations: list[Association],
    key_property: str | None,
) -> Record | BlockResult:
    """The created record, or — when the provider refuses with the id of a record that carries
    this step's own key (`_adopt_own_record`) — that record adopted. Any other refusal is
    raised for the caller to classify."""
    try:
        return port.create(object_type, properties, associations)
    except PortError as exc:
        adopted = _adopt_own_record(
            ctx,
            port,
            exc,
            object_type=object_type,
            properties=properties,
            key_property=key_property,
        )
        if adopted is not None:
            return adopted
        raise


def create_landed_query(ctx: BlockContext, config: BaseModel, target: Target) -> LandedQuery | None:
    """For the budget's reconcile: a create on a connection with a unique-value key property
    can be looked up by the key it stamped (the step's idempotency key), so an attempt whose
    fate stayed unknown is judged by whether its record exists. None without the property."""
    assert isinstance(config, CreateConfig)
    if not target.connection_id:
        return None
    port = target.port or _port(ctx, target.connection_id)
    key_property = port.idempotency_property if port.capabilities.write_idempotency else None
    if not key_property:
        return None
    return LandedQuery(
        target.connection_id, _object_type(ctx, config), key_property, ctx.idempotency_key
    )


def _create_or_adopt(
    ctx: BlockContext,
    *,
    config: CreateConfig,
    connection_id: str,
    port: CrmPort,
    object_type: str,
    properties: dict[str, Scalar],
    associations: list[Association],
) -> BlockResult:
    """An earlier try may have created the record. The key property makes a second create
    safe: either it creates (the earlier one never applied) or HubSpot refuses with the id of
    the record the earlier one made, which this step adopts."""
    try:
        made = _create_or_adopt_own(
            ctx,
            port,
            object_type=object_type,
            properties=properties,
            associations=associations,
            key_property=port.idempotency_property,
        )
    except PortError as exc:
        # Even ambiguous again, a transient failure is safe to retry: the key stays the guard.
        raise failure_from_port(exc, what="crm.create (retry of an ambiguous create)") from exc
    if isinstance(made, BlockResult):
        return made
    record = made
    _record_create_echo(ctx, config, connection_id, record)
    return BlockResult(output=_output(record))


def _adopt_own_record(
    ctx: BlockContext,
    port: CrmPort,
    exc: PortError,
    *,
    object_type: str,
    properties: Mapping[str, Scalar],
    key_property: str | None,
) -> BlockResult | None:
    """The step's result when `exc` is a 409 naming a record that carries this step's own
    key (an earlier try of this step, or of its lineage, made it); None for anything else.
    HubSpot's 409 names one existing record for whichever unique value clashed (its
    `errors[].in` says which, e.g. a contact's email), so the record is read back: only the
    key property proves it is ours."""
    if not key_property or exc.code != "conflict" or not exc.existing_id:
        return None
    try:
        existing = port.get(object_type, exc.existing_id, [key_property])
    except PortError as read_exc:
        # Unknown whose record it is; nothing was created by this try (409), and a retry is
        # safe (the key guards it): transient failures retry, anything else fails the step.
        raise failure_from_port(
            read_exc, what=f"crm.create (reading record {exc.existing_id}, named by a 409)"
        ) from read_exc
    if existing.properties.get(key_property) != ctx.idempotency_key:
        return None
    log.info("crm.create adopted record %s, which carries this step's key", exc.existing_id)
    adopted = Record(object_type, exc.existing_id, dict(properties))
    output = {**_output(adopted), "adopted_existing": exc.existing_id}
    return BlockResult(output=output, outcome_code=OUTCOME_ADOPTED_EXISTING)


def _mark_echo(
    tx: Tx,
    ctx: BlockContext,
    *,
    connection_id: str,
    object_type: str,
    object_id: str,
    properties: Mapping[str, Any],
    ttl_seconds: int,
    since_side_effect_mark: bool = False,
) -> None:
    """Echo markers for a write of `properties`, in `tx` (shared/ingest/echo.py says when each
    is sent)."""
    echo.record_echo_marker(
        tx,
        connection_id=connection_id,
        object_type=singular_object_type(object_type),
        object_id=object_id,
        fields=dict(properties),
        step_id=ctx.step_id,
        ttl_seconds=ttl_seconds,
        since_side_effect_mark=since_side_effect_mark,
        # Nobody reads the answer: it travels with the COMMIT (one round trip fewer).
        at_commit=True,
    )


def _record_create_echo(
    ctx: BlockContext, config: CreateConfig, connection_id: str, record: Record
) -> None:
    """Markers for the created record's properties, sent when the at-most-once mark was set.
    A failure here must not turn a create that happened into a failed step (a retry would
    find the mark and fail OUTCOME_UNKNOWN for a record that exists): it is logged, and the
    worst case is one echo admitted as a trigger."""
    try:
        ctx.database().run(
            lambda tx: _mark_echo(
                tx,
                ctx,
                connection_id=connection_id,
                object_type=record.object_type,
                object_id=record.id,
                properties=config.properties,
                ttl_seconds=ECHO_TTL_SECONDS,
                since_side_effect_mark=True,
            )
        )
    except Exception:
        log.warning("crm.create: echo markers for record %s not recorded", record.id, exc_info=True)


def _calling(what: str, call: Callable[[], _T]) -> _T:
    """The port call's answer; a PortError becomes the step's failure (failure_from_port)."""
    try:
        return call()
    except PortError as exc:
        raise failure_from_port(exc, what=what) from exc


# --- crm.update ---------------------------------------------------------------------------------
def execute_update(ctx: BlockContext, config: BaseModel) -> BlockResult:
    assert isinstance(config, UpdateConfig)
    object_type = _object_type(ctx, config)
    if ctx.dry_run:
        return dry_run_result(
            "crm.update",
            _output(Record(object_type, config.object_id, config.properties)),
            object_type=object_type,
            object_id=config.object_id,
            properties=config.properties,
        )
    # The echo marker was committed before the call, with the gates (`update_echo`).
    _, port = _connect(ctx, config)
    record = _calling(
        "crm.update", lambda: port.update(object_type, config.object_id, config.properties)
    )
    return BlockResult(output=_output(record))


def update_echo(tx: Tx, ctx: BlockContext, config: BaseModel, target: Target) -> None:
    """crm.update's `before_call`: its echo marker, committed with the gates before the call
    leaves (the webhook this write causes may arrive before the response)."""
    assert isinstance(config, UpdateConfig)
    assert target.connection_id is not None  # `connection_target` resolved it or refused
    _mark_echo(
        tx,
        ctx,
        connection_id=target.connection_id,
        object_type=_object_type(ctx, config),
        object_id=config.object_id,
        properties=config.properties,
        ttl_seconds=config.echo_ttl_seconds,
    )


# --- reads --------------------------------------------------------------------------------------
def execute_get(ctx: BlockContext, config: BaseModel) -> BlockResult:
    assert isinstance(config, GetConfig)
    object_type = _object_type(ctx, config)
    _, port = _connect(ctx, config)
    record = _calling("crm.get", lambda: port.get(object_type, config.object_id, config.properties))
    return BlockResult(output=_output(record))


def execute_search(ctx: BlockContext, config: BaseModel) -> BlockResult:
    assert isinstance(config, SearchConfig)
    object_type = _object_type(ctx, config)
    _, port = _connect(ctx, config)
    filters = [SearchFilter(f.property, f.operator.upper(), f.value) for f in config.filters]
    records = _calling("crm.search", lambda: port.search(object_type, filters, config.limit))
    return BlockResult(output={"count": len(records), "results": [_output(r) for r in records]})


def _action(
    type_name: str,
    config_model: type[BaseModel],
    side_effect: SideEffect,
    price: int,
    execute: Callable[[BlockContext, BaseModel], BlockResult],
    *,
    description: str,
    **more: Any,
) -> BlockSpec:
    """A CRM block: an action against the step's connection, behind the provider's gates."""
    return BlockSpec(
        type_name=type_name,
        config_model=config_model,
        kind="action",
        side_effect=side_effect,
        price=price,
        retry=ACTION_RETRY,
        gates=PROVIDER_GATES,
        target=connection_target,
        execute=execute,
        description=description,
        **more,
    )


CREATE = _action(
    "crm.create",
    CreateConfig,
    "at_most_once",
    2,
    execute_create,
    description="Create a CRM record. At most once: a lost response fails OUTCOME_UNKNOWN,"
    " unless the connection has a unique-value key property (then it is adopted).",
    landed_query=create_landed_query,
    creates=True,
    # With the connection's unique-value key property a lost response is retried and adopted;
    # without it the block refuses the retry as OUTCOME_UNKNOWN (execute_create).
    decides_ambiguous_retry=True,
)
UPDATE = _action(
    "crm.update",
    UpdateConfig,
    "idempotent",
    1,
    execute_update,
    description="Update CRM record properties (idempotent; the echo webhook is suppressed).",
    before_call=update_echo,
)
GET = _action("crm.get", GetConfig, "none", 1, execute_get, description="Read one CRM record.")
SEARCH = _action(
    "crm.search",
    SearchConfig,
    "none",
    1,
    execute_search,
    description="Search CRM records by property filters (AND).",
)
SPECS = (CREATE, UPDATE, GET, SEARCH)
