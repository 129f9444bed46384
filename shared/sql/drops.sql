-- Pre-admission drops (shared/ingest/drops.py): property changes the drain turned into no event.

-- name: drops_insert
INSERT INTO pre_admission_drops (tenant_id, connection_id, record_object_type, record_object_id,
                                 inbox_id, source_event_id, event_type, reason, fields,
                                 occurred_at)
VALUES (:tenant_id, CAST(:connection_id AS uuid), :object_type, :object_id, :inbox_id,
        :source_event_id, :event_type, :reason, CAST(:fields AS jsonb), :occurred_at)

-- name: drops_for_record
-- The newest drops of one record, for its timeline; tenant-scoped like every ops read.
SELECT id, event_type, source_event_id, inbox_id, reason, fields, occurred_at, recorded_at
FROM pre_admission_drops
WHERE tenant_id = :tenant_id
  AND connection_id = CAST(:connection_id AS uuid)
  AND record_object_type = :object_type
  AND record_object_id = :object_id
ORDER BY id DESC
LIMIT :limit

-- name: drops_trim
-- Retention: a batch of the oldest rows past the horizon per call.
DELETE FROM pre_admission_drops
WHERE id IN (SELECT id FROM pre_admission_drops
             WHERE recorded_at < now() - make_interval(days => :days)
             ORDER BY id
             LIMIT :batch)

-- name: webhook_refusal_count
INSERT INTO webhook_refusal_counts (connection_id, check_name)
VALUES (CAST(:connection_id AS uuid), :check_name)
ON CONFLICT (connection_id, check_name)
DO UPDATE SET refusals = webhook_refusal_counts.refusals + 1, last_seen_at = now()

-- name: webhook_refusals_for_connection
SELECT check_name, refusals, first_seen_at, last_seen_at
FROM webhook_refusal_counts
WHERE connection_id = CAST(:connection_id AS uuid)
ORDER BY last_seen_at DESC
