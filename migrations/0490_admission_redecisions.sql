-- Re-decide (issue 30, item 2): after a rule is fixed, an operator re-admits events a workflow
-- refused, under the workflow's current version. Each new decision is a row here, beside the
-- refusal it answers (the refusal row stays as it was: what admission decided then, and why).
-- One decision per (event, workflow, version): repeating a re-decision finds its row and does
-- nothing. At most one of an event's re-decisions for a workflow started a run
-- (`admission_redecisions_one_run`): with the refusal's delivery claim, an event still starts
-- at most one run per workflow whatever is re-decided. A re-decided run's start key is
-- `redecide:<event>:<version>`, under the (workflow, start_key) unique index like any start.
CREATE TABLE admission_redecisions (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant_id    text NOT NULL REFERENCES tenants (id),
    -- Retention deletes a refusal with its event (shared/sql/retention.sql); its
    -- re-decisions go with it. An event whose re-decision started a run is kept while the
    -- run is (retention_events_delete keeps events a run names); the run's own retention
    -- leaves the decision, without its run id.
    refusal_id   bigint NOT NULL REFERENCES admission_refusals (id) ON DELETE CASCADE,
    event_id     bigint NOT NULL REFERENCES workflow_trigger_events (id) ON DELETE CASCADE,
    workflow_id  uuid NOT NULL REFERENCES workflows (id),
    version_id   uuid NOT NULL REFERENCES workflow_versions (id),
    record_key   text,
    -- 'admitted' (run_id set) or the reason admission would record now, worded in `detail`.
    outcome      text NOT NULL,
    detail       text,
    run_id       uuid REFERENCES workflow_runs (id) ON DELETE SET NULL,
    bulk_id      uuid REFERENCES ops_bulk_previews (id),
    decided_at   timestamptz NOT NULL DEFAULT now(),
    UNIQUE (event_id, workflow_id, version_id)
);
CREATE UNIQUE INDEX admission_redecisions_one_run ON admission_redecisions (event_id, workflow_id)
    WHERE outcome = 'admitted';
CREATE INDEX admission_redecisions_refusal ON admission_redecisions (refusal_id);
CREATE INDEX admission_redecisions_run ON admission_redecisions (run_id);

ALTER TABLE ops_bulk_previews DROP CONSTRAINT ops_bulk_previews_action_check;
ALTER TABLE ops_bulk_previews ADD CONSTRAINT ops_bulk_previews_action_check
    CHECK (action IN ('replay', 'retry', 'cancel', 'requeue_inbox', 'redrive', 'redecide'));
