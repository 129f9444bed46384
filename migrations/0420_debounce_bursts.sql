-- Debounce per record (issue 29, item 1): a trigger's `debounce: {period, max_wait, key?}`
-- folds a burst of events for one key into one run (shared/admission/debounce.py).
--
-- One row per burst. `open` takes events (admission's guarded join moves `fire_at` to
-- `period` after the newest, never past `max_fire_at` = first event + max_wait); `closed` is
-- an open burst an admission found past its `fire_at` before the sweep fired it: it takes no
-- more events (the new event opens the next burst) and still fires; `fired` is final: the
-- sweep's guarded fire decided every event of the burst in one transaction (the last one by
-- admission's own statement, the others refused `superseded` naming the run). The burst's
-- run id is chosen when it opens, so every statement that names the run names the same one.
CREATE TABLE debounce_bursts (
    id              uuid PRIMARY KEY,
    tenant_id       text NOT NULL REFERENCES tenants (id),
    workflow_id     uuid NOT NULL REFERENCES workflows (id),
    burst_key       text NOT NULL,
    status          text NOT NULL DEFAULT 'open' CHECK (status IN ('open', 'closed', 'fired')),
    run_id          uuid NOT NULL UNIQUE,
    -- What admission decided for the newest event, so the fire starts its run without
    -- evaluating the trigger again: the version, dedup mode, record and entry step it saw.
    version_id      uuid NOT NULL REFERENCES workflow_versions (id),
    dedup_mode      text NOT NULL,
    record_key      text,
    trigger_record  jsonb NOT NULL,
    entry_node      text NOT NULL,
    entry_type      text NOT NULL,
    period_seconds  double precision NOT NULL CHECK (period_seconds > 0),
    first_event_id  bigint NOT NULL,
    last_event_id   bigint NOT NULL,
    first_event_at  timestamptz NOT NULL,
    last_event_at   timestamptz NOT NULL,
    event_count     integer NOT NULL DEFAULT 1 CHECK (event_count > 0),
    fire_at         timestamptz NOT NULL,
    max_fire_at     timestamptz NOT NULL,
    fired_at        timestamptz,
    -- Written by the fire: `admitted`, or the reason the last event was refused; and the
    -- burst's events, oldest first (what the run's scope lists as `event.burst`).
    outcome         text,
    events          jsonb,
    created_at      timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT debounce_bursts_fired_at CHECK ((status = 'fired') = (fired_at IS NOT NULL)),
    CONSTRAINT debounce_bursts_fire_by_max CHECK (fire_at <= max_fire_at)
);
-- At most one burst per (workflow, key) takes events: two admissions that both find none
-- open race on this index, and the loser decides again (admission's retry).
CREATE UNIQUE INDEX debounce_bursts_one_open ON debounce_bursts (workflow_id, burst_key)
    WHERE status = 'open';
-- The sweep's due index: bursts not fired yet, by fire time.
CREATE INDEX debounce_bursts_due ON debounce_bursts (fire_at) WHERE status <> 'fired';

-- The (event, workflow) pairings a burst holds until it fires: a pairing is in one burst at
-- most (primary key), so a redelivery of a held event finds it and does nothing.
CREATE TABLE debounce_burst_events (
    event_id     bigint NOT NULL,
    workflow_id  uuid NOT NULL,
    burst_id     uuid NOT NULL REFERENCES debounce_bursts (id) ON DELETE CASCADE,
    joined_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (event_id, workflow_id)
);
CREATE INDEX debounce_burst_events_burst ON debounce_burst_events (burst_id, event_id);

-- The reasons' one list is shared/admission/admit.py `Reason`; this CHECK mirrors it.
ALTER TABLE admission_refusals DROP CONSTRAINT admission_refusals_reason_check;
ALTER TABLE admission_refusals ADD CONSTRAINT admission_refusals_reason_check CHECK (reason IN (
    'duplicate', 'already_running', 'rule_not_matched', 'insufficient_credits',
    'echo_suppressed', 'provider_suppressed', 'missing_record_identity', 'workflow_paused',
    'definition_unreadable', 'superseded'));
