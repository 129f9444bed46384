-- The sweep's own bookkeeping and the small duties that need nothing but SQL.

-- name: sweep_duty_claim
-- One row back means this invocation owns the duty for this period; none means another
-- invocation ran it less than `every_seconds` ago (or is running it now).
INSERT INTO sweep_duties (name, last_started_at) VALUES (CAST(:name AS text), now())
ON CONFLICT (name) DO UPDATE SET last_started_at = now()
WHERE sweep_duties.last_started_at
      < now() - make_interval(secs => CAST(:every_seconds AS double precision))
RETURNING name

-- name: sweep_duty_record
UPDATE sweep_duties
SET last_finished_at = now(), last_ok = CAST(:ok AS boolean),
    last_result = CAST(:result AS jsonb), last_error = CAST(:error AS text)
WHERE name = CAST(:name AS text)

-- name: echo_markers_expire
-- Bounded, so one pass never holds locks on a huge backlog; the next period takes the rest.
DELETE FROM echo_markers
WHERE id IN (SELECT id FROM echo_markers WHERE expires_at < now()
             ORDER BY expires_at LIMIT CAST(:batch AS integer))
