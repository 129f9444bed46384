-- Every published trigger event reaches a decision, and onceflow — not the transport — makes
-- sure of it (issue: "exactly-once holes").
--
-- decided_at: stamped by the admission transaction that decided every bound workflow (runs,
--   refusals and delivery claims commit with it). A published event still undecided after the
--   sweep's threshold is put back in the outbox (published_at = NULL) and published again;
--   admission is idempotent, so a duplicate delivery costs nothing.
-- redeliveries: how many times the sweep put it back. At the cap the event is given up as
--   undelivered (undelivered_at, undelivered_reason), visible in "why didn't it run?", and ops
--   can re-queue it.
ALTER TABLE workflow_trigger_events
    ADD COLUMN decided_at          timestamptz,
    ADD COLUMN redeliveries        integer NOT NULL DEFAULT 0 CHECK (redeliveries >= 0),
    ADD COLUMN undelivered_at      timestamptz,
    ADD COLUMN undelivered_reason  text,
    ADD CONSTRAINT trigger_events_undelivered_reason
        CHECK ((undelivered_at IS NULL) = (undelivered_reason IS NULL)),
    ADD CONSTRAINT trigger_events_decided_or_undelivered
        CHECK (decided_at IS NULL OR undelivered_at IS NULL);

-- Events admitted before this migration: a delivery claim proves admission decided them.
-- The others (nothing bound, or never decided) are found by the sweep and published again,
-- in bounded batches; an event with nothing bound is stamped decided by that admission.
UPDATE workflow_trigger_events e
   SET decided_at = coalesce(e.published_at, e.created_at)
 WHERE EXISTS (SELECT 1 FROM delivery_claims c WHERE c.event_id = e.id);

-- The sweep's question "published, still undecided, not given up?" stays a small index range
-- however much history the table holds.
CREATE INDEX workflow_trigger_events_undecided
    ON workflow_trigger_events (published_at)
    WHERE decided_at IS NULL AND undelivered_at IS NULL AND published_at IS NOT NULL;

-- An application's emit() without a connection deduplicates on its source key too: NULL
-- connection ids were distinct in the old index, so the same key could enter twice. Scoped by
-- tenant, since events without a connection belong to no connection to scope them.
DROP INDEX workflow_trigger_events_source;
CREATE UNIQUE INDEX workflow_trigger_events_source
    ON workflow_trigger_events (tenant_id, connection_id, source_event_id) NULLS NOT DISTINCT
    WHERE source_event_id IS NOT NULL;

-- Ops lists the inbox rows that will not drain by themselves (dead) or ever (rejected): a
-- partial index keeps that list cheap however many rows were processed.
CREATE INDEX webhook_inbox_stuck ON webhook_inbox (connection_id, id)
    WHERE status IN ('dead', 'rejected');
