-- Admission: delivery claims, enrollments, refusals and echo markers.

-- The pairing (event, workflow) was handled, refusals included (invariant 3).
CREATE TABLE delivery_claims (
    event_id     bigint NOT NULL REFERENCES workflow_trigger_events (id),
    workflow_id  uuid NOT NULL REFERENCES workflows (id),
    run_id       uuid REFERENCES workflow_runs (id),
    claimed_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (event_id, workflow_id)
);

-- once_per_record: a record is enrolled in a workflow at most once, ever.
CREATE TABLE workflow_enrollments (
    workflow_id  uuid NOT NULL REFERENCES workflows (id),
    record_key   text NOT NULL,
    run_id       uuid NOT NULL REFERENCES workflow_runs (id),
    enrolled_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workflow_id, record_key)
);

-- Why an event did not start a run. Written outside the admission transaction so it
-- survives that transaction's rollback (invariant 5); one per (event, workflow).
CREATE TABLE admission_refusals (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant_id    text NOT NULL REFERENCES tenants (id),
    event_id     bigint NOT NULL REFERENCES workflow_trigger_events (id),
    workflow_id  uuid NOT NULL REFERENCES workflows (id),
    version_id   uuid REFERENCES workflow_versions (id),
    record_key   text,
    reason       text NOT NULL CHECK (reason IN (
                     'duplicate', 'already_running', 'rule_not_matched', 'insufficient_credits',
                     'echo_suppressed', 'provider_suppressed', 'missing_record_identity')),
    detail       text NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    UNIQUE (event_id, workflow_id)
);
CREATE INDEX admission_refusals_record ON admission_refusals (tenant_id, record_key, created_at);
CREATE INDEX admission_refusals_workflow ON admission_refusals (workflow_id, created_at);

-- Writes onceflow itself made to a CRM record: the webhook that echoes them back is refused.
CREATE TABLE echo_markers (
    id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    connection_id  uuid NOT NULL REFERENCES connections (id),
    object_type    text NOT NULL,
    object_id      text NOT NULL,
    field          text NOT NULL,
    value_hash     bytea NOT NULL,
    step_id        uuid REFERENCES workflow_steps (id),
    created_at     timestamptz NOT NULL DEFAULT now(),
    expires_at     timestamptz NOT NULL
);
CREATE INDEX echo_markers_lookup ON echo_markers (connection_id, object_type, object_id, field);
CREATE INDEX echo_markers_expiry ON echo_markers (expires_at);

-- Poisoned trigger-events messages (unknown event id, malformed data): recorded and acked.
CREATE TABLE poisoned_messages (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    source       text NOT NULL,
    message_id   text,
    data         text,
    reason       text NOT NULL,
    received_at  timestamptz NOT NULL DEFAULT now()
);
