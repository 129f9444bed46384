-- The outbox (workflow_trigger_events): typed events, claimed and published by id.

-- name: outbox_insert
-- A source event id seen before for this tenant and connection (or, for an application's own
-- emit(), for this tenant without a connection: NULLS NOT DISTINCT) is not a second event: no
-- row, no id.
INSERT INTO workflow_trigger_events
       (tenant_id, connection_id, event_type, source_event_id, inbox_id,
        record_object_type, record_object_id, author_id, author_source, changed_fields,
        occurred_at, payload, payload_truncated)
VALUES (:tenant_id, CAST(:connection_id AS uuid), :event_type, :source_event_id, :inbox_id,
        :record_object_type, :record_object_id, :author_id, :author_source,
        CAST(:changed_fields AS jsonb), :occurred_at, CAST(:payload AS jsonb), :payload_truncated)
ON CONFLICT (tenant_id, connection_id, source_event_id) WHERE source_event_id IS NOT NULL
DO NOTHING
RETURNING id

-- name: outbox_claim
-- Short transaction: take a time-boxed hold on a batch of unpublished rows. Rows under a
-- live hold are skipped; an expired hold (its publisher crashed or stalled) is taken over.
-- Reads only the partial "unpublished" index, so published history doesn't slow it down.
UPDATE workflow_trigger_events e
   SET publish_hold = :hold_id,
       hold_expires_at = now() + make_interval(secs => :hold_seconds)
 WHERE e.id IN (SELECT id FROM workflow_trigger_events
                 WHERE published_at IS NULL
                   AND (hold_expires_at IS NULL OR hold_expires_at < now())
                 ORDER BY id
                 LIMIT :limit
                   FOR UPDATE SKIP LOCKED)
RETURNING e.id

-- name: outbox_mark_published
-- Fenced on the hold: a publisher whose hold expired and was taken over marks nothing (the
-- new holder publishes again; a duplicate downstream is harmless, a loss would not be).
UPDATE workflow_trigger_events
   SET published_at = now()
 WHERE id = ANY(CAST(:ids AS bigint[])) AND publish_hold = :hold_id AND published_at IS NULL

-- name: outbox_release_hold
-- A failed publish gives the rows back at once instead of waiting for the hold to expire.
UPDATE workflow_trigger_events
   SET publish_hold = NULL, hold_expires_at = NULL
 WHERE id = ANY(CAST(:ids AS bigint[])) AND publish_hold = :hold_id AND published_at IS NULL

-- name: outbox_requeue_undecided
-- The sweep's guarantee that every published event reaches a decision, whatever the transport
-- did with it (dropped, dead-lettered, stuck in nack backoff, pushed to a restarting
-- process): a published event that admission has not decided after :after_seconds goes back
-- into the outbox (published_at = NULL, hold released) and the publisher sends it again.
-- Admission is idempotent, so a message that was merely slow costs a no-op. After
-- :max_redeliveries the event is given up instead: undelivered_at and the reason are set, it
-- leaves the undecided index, and "why didn't it run?" shows it (ops can re-queue it).
-- Reads only the partial "undecided" index; SKIP LOCKED so two sweeps never take one row.
WITH due AS (
    SELECT id FROM workflow_trigger_events
    WHERE decided_at IS NULL AND undelivered_at IS NULL AND published_at IS NOT NULL
      AND published_at < now() - make_interval(secs => CAST(:after_seconds AS double precision))
    ORDER BY published_at
    LIMIT CAST(:batch AS integer)
    FOR UPDATE SKIP LOCKED
)
UPDATE workflow_trigger_events e
SET published_at = CASE WHEN e.redeliveries < CAST(:max_redeliveries AS integer)
                        THEN NULL ELSE e.published_at END,
    publish_hold = NULL,
    hold_expires_at = NULL,
    redeliveries = e.redeliveries
                   + CASE WHEN e.redeliveries < CAST(:max_redeliveries AS integer) THEN 1 ELSE 0 END,
    undelivered_at = CASE WHEN e.redeliveries >= CAST(:max_redeliveries AS integer)
                          THEN now() END,
    undelivered_reason = CASE WHEN e.redeliveries >= CAST(:max_redeliveries AS integer)
        THEN 'published ' || (e.redeliveries + 1) || ' times and admission never committed a '
             || 'decision (the message was lost or dead-lettered, or admission kept failing: '
             || 'see poisoned_messages and the admit_event logs)' END
FROM due
WHERE e.id = due.id
RETURNING e.id, e.redeliveries, e.undelivered_at IS NOT NULL AS given_up

-- name: outbox_requeue_undelivered
-- Ops: put an event that was given up (or is still undecided) back into the outbox, with its
-- redelivery budget reset. Zero rows: no such event for the tenant, or it was decided.
UPDATE workflow_trigger_events
SET published_at = NULL, publish_hold = NULL, hold_expires_at = NULL, redeliveries = 0,
    undelivered_at = NULL, undelivered_reason = NULL
WHERE id = CAST(:event_id AS bigint) AND decided_at IS NULL
  AND (CAST(:tenant_id AS text) IS NULL OR tenant_id = CAST(:tenant_id AS text))
RETURNING id
