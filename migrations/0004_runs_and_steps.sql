-- Runs (one per admitted trigger occurrence) and their step journal.

CREATE TABLE workflow_runs (
    id                uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    tenant_id         text NOT NULL REFERENCES tenants (id),
    workflow_id       uuid NOT NULL,
    -- The pinned version: a run executes the graph it started with (invariant 9).
    version_id        uuid NOT NULL,
    -- 'workflow_event:<eventId>' for live runs; replays and rehearsals carry their own prefix.
    start_key         text NOT NULL,
    event_id          bigint REFERENCES workflow_trigger_events (id),
    -- '<connection>:<object type>:<object id>' or null when the trigger has no record.
    record_key        text,
    dedup_mode        text NOT NULL
                      CHECK (dedup_mode IN ('once_per_record', 'not_while_running', 'every_time')),
    -- live runs are what executors and history see; rehearsals never touch live state.
    namespace         text NOT NULL DEFAULT 'live' CHECK (namespace IN ('live', 'rehearsal')),
    status            text NOT NULL DEFAULT 'running'
                      CHECK (status IN ('running', 'succeeded', 'failed', 'cancelled')),
    trigger_payload   jsonb NOT NULL,
    payload_truncated boolean NOT NULL DEFAULT false,
    -- Replay lineage: the run this one replays, and the first run of the lineage.
    replay_of         uuid REFERENCES workflow_runs (id),
    lineage_root      uuid NOT NULL,
    error             text,
    created_at        timestamptz NOT NULL DEFAULT now(),
    finished_at       timestamptz,
    UNIQUE (workflow_id, start_key),
    FOREIGN KEY (version_id, workflow_id) REFERENCES workflow_versions (id, workflow_id),
    FOREIGN KEY (workflow_id, tenant_id) REFERENCES workflows (id, tenant_id),
    CONSTRAINT runs_finished_iff_terminal CHECK ((status = 'running') = (finished_at IS NULL))
);
-- Backstop for the dedup modes: never two active live runs of a workflow for one record
-- where the mode forbids it, even if the advisory-lock logic were wrong.
CREATE UNIQUE INDEX workflow_runs_one_active_per_record
    ON workflow_runs (workflow_id, record_key)
    WHERE status = 'running' AND namespace = 'live' AND record_key IS NOT NULL
      AND dedup_mode IN ('once_per_record', 'not_while_running');
CREATE INDEX workflow_runs_tenant_created ON workflow_runs (tenant_id, created_at DESC, id);
CREATE INDEX workflow_runs_record ON workflow_runs (tenant_id, record_key);
CREATE INDEX workflow_runs_failed ON workflow_runs (tenant_id, finished_at) WHERE status = 'failed';
CREATE INDEX workflow_runs_lineage ON workflow_runs (lineage_root);

-- Steps. Status meanings (who moves rows in and out is documented in shared/steps/states.py):
--   pending            ready to be claimed by advance_step
--   running            claimed under a lease (lease_id, lease_expires_at)
--   waiting_for_delay  a delay is being served; wake_at = when it is over
--   waiting_for_retry  a failed attempt waits; wake_at = when to try again
--   succeeded/skipped/failed  terminal, with finished_at
CREATE TABLE workflow_steps (
    id                    uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    run_id                uuid NOT NULL REFERENCES workflow_runs (id),
    -- The journal key: the node id, or 'node[i]' for a repeated/foreach iteration.
    step_key              text NOT NULL CHECK (step_key ~ '^[A-Za-z_][A-Za-z0-9_-]*(\[[0-9]+\])*$'),
    node_id               text NOT NULL,
    block_type            text NOT NULL,
    status                text NOT NULL DEFAULT 'pending' CHECK (status IN (
                              'pending', 'running', 'waiting_for_delay', 'waiting_for_retry',
                              'succeeded', 'skipped', 'failed')),
    attempt               integer NOT NULL DEFAULT 0 CHECK (attempt >= 0),
    lease_id              uuid,
    lease_expires_at      timestamptz,
    wake_at               timestamptz,
    dispatched_at         timestamptz,
    -- Generated client-side and journaled before any request leaves (invariant 6).
    idempotency_key       text,
    -- Set WHERE NULL before an at-most-once side effect (invariant 10).
    side_effect_started_at timestamptz,
    input                 jsonb,
    output                jsonb,
    error                 text,
    error_class           text CHECK (error_class IN ('transient', 'permanent')),
    outcome_code          text,
    branch_choice         text,
    copied_from           uuid REFERENCES workflow_steps (id),
    created_at            timestamptz NOT NULL DEFAULT now(),
    started_at            timestamptz,
    finished_at           timestamptz,
    UNIQUE (run_id, step_key),
    CONSTRAINT steps_finished_iff_terminal
        CHECK ((status IN ('succeeded', 'skipped', 'failed')) = (finished_at IS NOT NULL)),
    CONSTRAINT steps_running_has_lease
        CHECK ((status = 'running') = (lease_id IS NOT NULL AND lease_expires_at IS NOT NULL)),
    CONSTRAINT steps_waiting_has_wake
        CHECK ((status IN ('waiting_for_delay', 'waiting_for_retry')) = (wake_at IS NOT NULL))
);
-- The sweep's three questions, each answered from a small partial index.
CREATE INDEX workflow_steps_expired_leases ON workflow_steps (lease_expires_at)
    WHERE status = 'running';
CREATE INDEX workflow_steps_due ON workflow_steps (wake_at)
    WHERE status IN ('waiting_for_delay', 'waiting_for_retry');
CREATE INDEX workflow_steps_pending ON workflow_steps (dispatched_at) WHERE status = 'pending';
