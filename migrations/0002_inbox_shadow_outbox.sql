-- Events in: raw webhook inbox -> shadow records -> typed trigger events (the outbox).

-- Raw, verified webhook bodies. A provider's identical retry is the same row.
CREATE TABLE webhook_inbox (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    connection_id    uuid NOT NULL REFERENCES connections (id),
    body_sha256      bytea NOT NULL,
    body             bytea NOT NULL,
    headers          jsonb NOT NULL DEFAULT '{}'::jsonb,
    received_at      timestamptz NOT NULL DEFAULT now(),
    deliveries       integer NOT NULL DEFAULT 1,
    -- pending: waiting to be drained (maybe leased); processed: events written;
    -- rejected: verified but unparseable, never retried; dead: transient failures ran out.
    status           text NOT NULL DEFAULT 'pending'
                     CHECK (status IN ('pending', 'processed', 'rejected', 'dead')),
    attempts         integer NOT NULL DEFAULT 0,
    next_attempt_at  timestamptz NOT NULL DEFAULT now(),
    lease_id         uuid,
    lease_expires_at timestamptz,
    finished_at      timestamptz,
    last_error       text,
    -- What the drain made of it: {"produced": n, "dropped": {"reason": n}}.
    outcome          jsonb,
    UNIQUE (connection_id, body_sha256),
    CONSTRAINT inbox_finished_iff_terminal
        CHECK ((status = 'pending') = (finished_at IS NULL)),
    CONSTRAINT inbox_lease_pair CHECK ((lease_id IS NULL) = (lease_expires_at IS NULL))
);
-- "What is left to drain?" stays fast however many rows were processed.
CREATE INDEX webhook_inbox_pending ON webhook_inbox (next_attempt_at) WHERE status = 'pending';

-- Last-seen state of each watched field per record: an update fires only on a real change.
CREATE TABLE shadow_records (
    connection_id  uuid NOT NULL REFERENCES connections (id),
    object_type    text NOT NULL,
    object_id      text NOT NULL,
    field          text NOT NULL,
    value_hash     bytea NOT NULL,
    occurred_at    timestamptz NOT NULL,
    last_event_id  text,
    updated_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (connection_id, object_type, object_id, field)
);

-- The outbox: typed trigger events. Written in the same transaction as the change they
-- describe (drain_inbox, or an application through shared.ingest.outbox.emit).
CREATE TABLE workflow_trigger_events (
    id                bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant_id         text NOT NULL REFERENCES tenants (id),
    connection_id     uuid REFERENCES connections (id),
    event_type        text NOT NULL CHECK (event_type ~ '^[a-z0-9_]+(\.[a-z0-9_]+)+$'),
    -- The provider's own event id, when it has one; unique per connection so a re-announced
    -- event can't become a second trigger event.
    source_event_id   text,
    inbox_id          bigint REFERENCES webhook_inbox (id),
    -- Record identity: all three or none.
    record_object_type text,
    record_object_id   text,
    -- Who made the change at the provider (for echo and author suppression).
    author_id         text,
    author_source     text,
    -- The fields this event changed, for echo matching: {"field": "value", ...}.
    changed_fields    jsonb NOT NULL DEFAULT '{}'::jsonb,
    occurred_at       timestamptz NOT NULL DEFAULT now(),
    payload           jsonb NOT NULL,
    payload_truncated boolean NOT NULL DEFAULT false,
    created_at        timestamptz NOT NULL DEFAULT now(),
    published_at      timestamptz,
    publish_hold      uuid,
    hold_expires_at   timestamptz,
    CONSTRAINT trigger_events_record_identity
        CHECK ((record_object_type IS NULL) = (record_object_id IS NULL)),
    CONSTRAINT trigger_events_hold_pair CHECK ((publish_hold IS NULL) = (hold_expires_at IS NULL))
);
CREATE UNIQUE INDEX workflow_trigger_events_source
    ON workflow_trigger_events (connection_id, source_event_id)
    WHERE source_event_id IS NOT NULL;
-- The publisher's claim only ever reads unpublished rows: this index stays small.
CREATE INDEX workflow_trigger_events_unpublished
    ON workflow_trigger_events (id) WHERE published_at IS NULL;
CREATE INDEX workflow_trigger_events_record
    ON workflow_trigger_events (tenant_id, record_object_type, record_object_id, id);
