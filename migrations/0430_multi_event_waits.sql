-- Waits on several events (`mode` any / all) and waits correlated beyond the run's own record
-- (`correlate`): issue 31, items 1 and 2. The single-event form (event_type, record_key,
-- condition) is left as it was; a wait of the new form names what it awaits in `awaits`
-- (one entry per awaited event: its name, type, condition, the correlation expression over
-- the incoming event — '' for the event's own record — and the value it must equal, computed
-- on the run's side when the wait parked) and in `await_keys`, one text key per awaited event
-- (tenant, type, correlation expression, value: shared/steps/awaits.py await_key), which a GIN
-- index serves: admission finds the waits an event answers by its keys, never by a scan.
-- `matched` collects the awaited events that matched (name -> the event as the step's output
-- shows it); the park is resumed, in one guarded statement as before, when `any` has one or
-- `all` has every name.
ALTER TABLE step_parks
    ADD COLUMN mode text CHECK (mode IN ('any', 'all')),
    ADD COLUMN awaits jsonb,
    ADD COLUMN await_keys text[],
    ADD COLUMN matched jsonb NOT NULL DEFAULT '{}'::jsonb,
    ADD CONSTRAINT parks_mode_is_an_event_wait CHECK (mode IS NULL OR kind = 'event'),
    ADD CONSTRAINT parks_awaits_with_mode
        CHECK ((mode IS NULL) = (awaits IS NULL) AND (mode IS NULL) = (await_keys IS NULL)
               AND (mode IS NULL OR cardinality(await_keys) > 0));
ALTER TABLE step_parks DROP CONSTRAINT parks_event_fields;
ALTER TABLE step_parks ADD CONSTRAINT parks_event_fields CHECK (kind <> 'event' OR (
    on_timeout IN ('fail', 'continue', 'goto')
    AND (mode IS NOT NULL
         OR (event_type IS NOT NULL AND record_key IS NOT NULL AND condition IS NOT NULL))));
CREATE INDEX step_parks_open_awaits ON step_parks USING gin (await_keys)
    WHERE kind = 'event' AND resumed_at IS NULL AND await_keys IS NOT NULL;

-- Which correlation expressions open waits of the new form use, per (tenant, event type): ''
-- for the record. Admission reads it by primary key (one small range per event) to know which
-- keys to compute for an event, and whether there is anything to look up at all. Written
-- with the park row (in its transaction), never deleted: it is bounded by the distinct
-- expressions in a tenant's workflows, not by traffic.
CREATE TABLE wait_correlations (
    tenant_id   text NOT NULL REFERENCES tenants (id),
    event_type  text NOT NULL,
    expression  text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, event_type, expression)
);

-- A correlated wait that parks looks back for the events of its types recorded since its park
-- row was written (admission offers it every later one): by time, which a BRIN index on the
-- append-ordered events table serves for next to nothing on insert.
CREATE INDEX workflow_trigger_events_created_brin ON workflow_trigger_events
    USING brin (created_at);
