-- Echo markers: writes onceflow itself made to a CRM record, so the webhook they cause is
-- refused at admission (`echo_suppressed`) instead of starting a workflow again.

-- name: echo_markers_insert
-- One row per written field. crm.update commits it BEFORE its request leaves (the provider's
-- webhook for the write may arrive before the update's response does): sent now. crm.create
-- can only record it once the response names the new record: sent when the step's
-- at-most-once mark was set, just before the request left (`since_side_effect_mark`).
-- keep_until: expiry plus the grace of the connection's provider, looked up in the
-- (provider, grace) table shared/ingest/echo.py passes (`providers`, `grace_seconds`); a provider
-- missing from it gets the longest grace (`max_grace_seconds`), never none.
INSERT INTO echo_markers (connection_id, object_type, object_id, field, value_hash, step_id,
                          sent_at, expires_at, keep_until)
SELECT CAST(:connection_id AS uuid), :object_type, :object_id, m.field, m.value_hash,
       CAST(:step_id AS uuid), sent.at,
       sent.at + make_interval(secs => CAST(:ttl_seconds AS double precision)),
       sent.at + make_interval(secs => CAST(:ttl_seconds AS double precision) + grace.seconds)
FROM unnest(CAST(:fields AS text[]), CAST(:value_hashes AS bytea[])) AS m (field, value_hash),
     LATERAL (SELECT coalesce(
                  CASE WHEN CAST(:since_side_effect_mark AS boolean)
                       THEN (SELECT s.side_effect_started_at FROM workflow_steps s
                              WHERE s.id = CAST(:step_id AS uuid)) END,
                  now()) AS at) AS sent,
     LATERAL (SELECT coalesce(
                  (SELECT g.seconds
                     FROM connections c
                     JOIN unnest(CAST(:providers AS text[]),
                                 CAST(:grace_seconds AS double precision[]))
                          AS g (provider, seconds) ON g.provider = c.provider
                    WHERE c.id = CAST(:connection_id AS uuid)),
                  CAST(:max_grace_seconds AS double precision)) AS seconds) AS grace

-- name: echo_markers_for_change
-- The markers that could explain a change to `fields` of one record (echo_markers_alive,
-- migration 0101, is the one definition admission uses too): sent before the change happened
-- (within the clock skew) and not yet expired when it happened. Judged at the change's own
-- time, not at admission time, so a backlog of trigger events doesn't turn echoes into
-- triggers.
SELECT field, value_hash
FROM echo_markers_alive(CAST(:connection_id AS uuid), :object_type, :object_id,
                        CAST(:fields AS text[]), CAST(:occurred_at AS timestamptz),
                        CAST(:skew_seconds AS double precision))

-- name: echo_markers_expire
-- The sweep's cleanup: markers whose provider can no longer deliver their echo (keep_until,
-- fixed at insert). Bounded so one pass never holds a long lock; the keep_until index serves it.
WITH gone AS (
    SELECT id FROM echo_markers
    WHERE keep_until < now()
    ORDER BY keep_until
    LIMIT CAST(:batch AS integer)
)
DELETE FROM echo_markers m USING gone WHERE m.id = gone.id
