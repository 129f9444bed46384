-- Runs that wait: one park-and-resume mechanism for `wait_for` (an event) and `approval` (a
-- decision). A step parks in `waiting_for_event` or `waiting_for_approval` only with its park
-- row (the conditions, the deadline, who may decide) written and committed first; the step
-- row names it (park_id, park_kind: a composite foreign key, so the kind can't disagree) and
-- carries the deadline in wake_at, where the sweep finds it through an index. Whoever
-- resumes it — a matching event, a decision, the deadline, a cancel — does so in one guarded
-- UPDATE of the step row that also closes the park row; the others change nothing.

CREATE TABLE step_parks (
    id                bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- One park per step: an attempt that crashed after writing it and runs again finds it
    -- (the first park's conditions and deadline are the truth).
    step_id           uuid NOT NULL UNIQUE REFERENCES workflow_steps (id),
    run_id            uuid NOT NULL REFERENCES workflow_runs (id),
    tenant_id         text NOT NULL REFERENCES tenants (id),
    kind              text NOT NULL CHECK (kind IN ('event', 'approval')),
    deadline          timestamptz NOT NULL,
    -- event: fail | continue | goto; approval: reject | proceed.
    on_timeout        text NOT NULL,
    timeout_goto      text,
    -- An event wait: the event type, the record it correlates on, a CEL condition over the
    -- incoming event and the waiting run's scope (kept here as the wait saw it), and how long
    -- before the park an event may have arrived and still count.
    event_type        text,
    record_key        text,
    condition         text,
    scope             jsonb,
    lookback_seconds  double precision NOT NULL DEFAULT 0 CHECK (lookback_seconds >= 0),
    -- An approval: who may decide (a tenant role, named users, or both) and what they see.
    approver_role     text,
    approver_users    text[] NOT NULL DEFAULT '{}',
    summary           text,
    decision          text CHECK (decision IN ('approved', 'rejected')),
    decided_by        text,
    decision_comment  text,
    -- The resume: by whom, when; the event that matched.
    resumed_at        timestamptz,
    resumed_by        text CHECK (resumed_by IN ('event', 'decision', 'deadline', 'cancel')),
    resumed_event_id  bigint REFERENCES workflow_trigger_events (id),
    created_at        timestamptz NOT NULL DEFAULT now(),
    UNIQUE (id, kind),
    CONSTRAINT parks_event_fields CHECK (kind <> 'event' OR (
        event_type IS NOT NULL AND record_key IS NOT NULL AND condition IS NOT NULL
        AND on_timeout IN ('fail', 'continue', 'goto'))),
    CONSTRAINT parks_approval_fields CHECK (kind <> 'approval' OR (
        summary IS NOT NULL AND on_timeout IN ('reject', 'proceed')
        AND (approver_role IS NOT NULL OR cardinality(approver_users) > 0))),
    CONSTRAINT parks_goto_has_target CHECK ((on_timeout = 'goto') = (timeout_goto IS NOT NULL)),
    CONSTRAINT parks_resumed_pair CHECK ((resumed_at IS NULL) = (resumed_by IS NULL)),
    CONSTRAINT parks_event_resume_names_it
        CHECK ((resumed_by = 'event') = (resumed_event_id IS NOT NULL)),
    CONSTRAINT parks_decision_is_a_resume CHECK ((decision IS NOT NULL) = (
        kind = 'approval' AND resumed_by = 'decision' AND decided_by IS NOT NULL))
);
-- Admission offers every event to the open waits for its (tenant, type, record): an index
-- lookup, so parked runs never make admission scan.
CREATE INDEX step_parks_open_event_waits ON step_parks (tenant_id, event_type, record_key)
    WHERE kind = 'event' AND resumed_at IS NULL;
-- The ops list of approvals waiting for a decision.
CREATE INDEX step_parks_open_approvals ON step_parks (tenant_id, created_at)
    WHERE kind = 'approval' AND resumed_at IS NULL;
CREATE INDEX step_parks_run ON step_parks (run_id);

ALTER TABLE workflow_steps ADD COLUMN park_id bigint;
ALTER TABLE workflow_steps ADD COLUMN park_kind text;
ALTER TABLE workflow_steps ADD CONSTRAINT steps_park_fk
    FOREIGN KEY (park_id, park_kind) REFERENCES step_parks (id, kind);
ALTER TABLE workflow_steps DROP CONSTRAINT workflow_steps_status_check;
ALTER TABLE workflow_steps ADD CONSTRAINT workflow_steps_status_check CHECK (status IN (
    'pending', 'running', 'waiting_for_delay', 'waiting_for_retry', 'waiting_for_event',
    'waiting_for_approval', 'succeeded', 'skipped', 'failed'));
ALTER TABLE workflow_steps DROP CONSTRAINT steps_waiting_has_wake;
-- Every parked step has its wake time: the end of a delay, the next retry, a wait's deadline.
ALTER TABLE workflow_steps ADD CONSTRAINT steps_waiting_has_wake CHECK (
    (status IN ('waiting_for_delay', 'waiting_for_retry', 'waiting_for_event',
                'waiting_for_approval')) = (wake_at IS NOT NULL));
-- A step waiting for an event or a decision names its park row of that kind.
ALTER TABLE workflow_steps ADD CONSTRAINT steps_waiting_for_event_has_park CHECK (
    status <> 'waiting_for_event' OR (park_id IS NOT NULL AND park_kind = 'event'));
ALTER TABLE workflow_steps ADD CONSTRAINT steps_waiting_for_approval_has_park CHECK (
    status <> 'waiting_for_approval' OR (park_id IS NOT NULL AND park_kind = 'approval'));
ALTER TABLE workflow_steps ADD CONSTRAINT steps_park_kind_pair
    CHECK ((park_id IS NULL) = (park_kind IS NULL));
-- The sweep's "what is due" covers the waits' deadlines from the same small partial index.
DROP INDEX workflow_steps_due;
CREATE INDEX workflow_steps_due ON workflow_steps (wake_at)
    WHERE status IN ('waiting_for_delay', 'waiting_for_retry', 'waiting_for_event',
                     'waiting_for_approval');

-- A lease may end with its step parked on a wait.
ALTER TABLE workflow_step_leases DROP CONSTRAINT step_leases_end_status_fits_kind;
ALTER TABLE workflow_step_leases ADD CONSTRAINT step_leases_end_status_fits_kind CHECK (
    (end_kind IS NULL AND end_status IS NULL)
    OR (end_kind = 'settled'
        AND end_status IN ('succeeded', 'failed', 'waiting_for_delay', 'waiting_for_retry',
                           'waiting_for_event', 'waiting_for_approval'))
    OR (end_kind = 'reclaimed' AND end_status IN ('pending', 'failed')));
