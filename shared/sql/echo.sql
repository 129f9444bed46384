-- Echo markers: writes onceflow itself made to a CRM record, so the webhook they cause is
-- refused at admission (`echo_suppressed`) instead of starting a workflow again.

-- name: echo_markers_insert
-- One row per written field. Committed by crm.update BEFORE its request leaves: the provider's
-- webhook for the write may arrive before the update's response does.
INSERT INTO echo_markers (connection_id, object_type, object_id, field, value_hash, step_id,
                          expires_at)
SELECT CAST(:connection_id AS uuid), :object_type, :object_id, m.field, m.value_hash,
       CAST(:step_id AS uuid), now() + make_interval(secs => CAST(:ttl_seconds AS double precision))
FROM unnest(CAST(:fields AS text[]), CAST(:value_hashes AS bytea[])) AS m (field, value_hash)

-- name: echo_markers_for_change
-- The markers that could explain a change to `fields` of one record: alive when the change
-- happened. Expiry is judged at the change's own time, not at admission time, so a backlog
-- of trigger events doesn't turn echoes into triggers.
SELECT field, value_hash
FROM echo_markers
WHERE connection_id = CAST(:connection_id AS uuid) AND object_type = :object_type
  AND object_id = :object_id AND field = ANY(CAST(:fields AS text[]))
  AND expires_at > :occurred_at

-- name: echo_markers_expire
-- The sweep's cleanup, bounded so one pass never holds a long lock; the expiry index serves it.
WITH gone AS (
    SELECT id FROM echo_markers
    WHERE expires_at < now() - make_interval(secs => CAST(:grace_seconds AS double precision))
    ORDER BY expires_at
    LIMIT CAST(:batch AS integer)
)
DELETE FROM echo_markers m USING gone WHERE m.id = gone.id
