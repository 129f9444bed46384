-- Names and emails of records (shared/port/record_labels.py) and a connection's last real call
-- (shared/port/observed.py).

-- name: record_labels_upsert
-- Writes nothing when the row already says the same (no churn, no dead tuples for a record
-- read again and again).
INSERT INTO record_labels (record_key, connection_id, label, email)
VALUES (:record_key, CAST(:connection_id AS uuid), :label, :email)
ON CONFLICT (record_key) DO UPDATE
   SET label = coalesce(EXCLUDED.label, record_labels.label),
       email = coalesce(EXCLUDED.email, record_labels.email),
       updated_at = now()
 WHERE (EXCLUDED.label IS NOT NULL AND EXCLUDED.label IS DISTINCT FROM record_labels.label)
    OR (EXCLUDED.email IS NOT NULL AND EXCLUDED.email IS DISTINCT FROM record_labels.email)

-- name: record_labels_get_many
-- `shown`: how the label reads (the migration's record_label function, its one home).
SELECT record_key, record_label(label, email) AS shown
  FROM record_labels WHERE record_key = ANY(CAST(:keys AS text[]))

-- name: connections_note_last_call
-- The newest call wins: an instance whose note is older than what another wrote changes nothing.
UPDATE connections
   SET last_call_at = CAST(:at AS timestamptz), last_call_ok = :ok, last_call_error = :error
 WHERE id = CAST(:connection_id AS uuid)
   AND (last_call_at IS NULL OR last_call_at < CAST(:at AS timestamptz))
