-- Shadow records: the last-seen value hash and time of each watched field of a record.

-- name: shadow_lock
SELECT value_hash, occurred_at, last_event_id
  FROM shadow_records
 WHERE connection_id = CAST(:connection_id AS uuid) AND object_type = :object_type
   AND object_id = :object_id AND field = :field
   FOR UPDATE

-- name: shadow_insert
-- First sighting. DO NOTHING + no row back means a concurrent drainer saw it first: the
-- caller re-reads under lock and judges against that.
INSERT INTO shadow_records
       (connection_id, object_type, object_id, field, value_hash, occurred_at, last_event_id)
VALUES (CAST(:connection_id AS uuid), :object_type, :object_id, :field, :value_hash,
        :occurred_at, :event_id)
ON CONFLICT (connection_id, object_type, object_id, field) DO NOTHING
RETURNING 1 AS inserted

-- name: shadow_update
UPDATE shadow_records
   SET value_hash = :value_hash, occurred_at = :occurred_at, last_event_id = :event_id,
       updated_at = now()
 WHERE connection_id = CAST(:connection_id AS uuid) AND object_type = :object_type
   AND object_id = :object_id AND field = :field
