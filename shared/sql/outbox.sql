-- The outbox (workflow_trigger_events): typed events, claimed and published by id.

-- name: outbox_insert
-- A provider event id seen before on this connection is not a second event: no row, no id.
INSERT INTO workflow_trigger_events
       (tenant_id, connection_id, event_type, source_event_id, inbox_id,
        record_object_type, record_object_id, author_id, author_source, changed_fields,
        occurred_at, payload, payload_truncated)
VALUES (:tenant_id, CAST(:connection_id AS uuid), :event_type, :source_event_id, :inbox_id,
        :record_object_type, :record_object_id, :author_id, :author_source,
        CAST(:changed_fields AS jsonb), :occurred_at, CAST(:payload AS jsonb), :payload_truncated)
ON CONFLICT (connection_id, source_event_id) WHERE source_event_id IS NOT NULL DO NOTHING
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
