-- "Why didn't it run?" before the outbox: a property change the drain turned into no trigger
-- event (no active workflow watches the field, the value did not change, it arrived out of
-- order, or the provider announced it again), recorded per record with the field values
-- involved, so the record's timeline can say so in plain words. Kept for
-- ONCEFLOW_DROP_RETENTION_DAYS (the sweep trims older rows); the inbox row keeps the counts.
CREATE TABLE pre_admission_drops (
    id                 bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant_id          text NOT NULL REFERENCES tenants (id),
    connection_id      uuid NOT NULL REFERENCES connections (id),
    record_object_type text NOT NULL,
    record_object_id   text NOT NULL,
    -- The inbox row it came in (not a foreign key: inbox rows are archived on their own clock).
    inbox_id           bigint,
    source_event_id    text,
    event_type         text NOT NULL,
    reason             text NOT NULL
                       CHECK (reason IN ('not_watched', 'unchanged', 'out_of_order', 're_announced')),
    -- {"field": value} as the provider announced them, each value cut to 200 characters.
    fields             jsonb NOT NULL DEFAULT '{}'::jsonb,
    occurred_at        timestamptz NOT NULL,
    recorded_at        timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX pre_admission_drops_record
    ON pre_admission_drops (connection_id, record_object_type, record_object_id, id);
CREATE INDEX pre_admission_drops_recorded ON pre_admission_drops USING brin (recorded_at);

-- Webhooks refused at the door for a known connection (a signature that did not match, a
-- stale timestamp, a disconnected connection): counts and when, per connection and check,
-- never the body. One row per (connection, check), so a flood of forged requests updates a
-- row instead of growing a table.
CREATE TABLE webhook_refusal_counts (
    connection_id  uuid NOT NULL REFERENCES connections (id),
    check_name     text NOT NULL CHECK (check_name ~ '^[a-z0-9_]{1,64}$'),
    refusals       bigint NOT NULL DEFAULT 1 CHECK (refusals >= 1),
    first_seen_at  timestamptz NOT NULL DEFAULT now(),
    last_seen_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (connection_id, check_name)
);
