-- Cron triggers: the schedules of active workflows and their ticks (shared/triggers/cron.py).

-- name: cron_schedules_active
-- Every active version whose trigger is a schedule, with the instant up to which its ticks
-- are decided: the newest tick recorded, or the activation if later (ticks from before the
-- workflow was activated belong to nobody). greatest() ignores the NULL of "no tick yet".
SELECT w.id::text AS workflow_id, w.tenant_id, w.name, a.version_id::text AS version_id,
       v.definition -> 'trigger' AS trigger,
       greatest(a.activated_at,
                (SELECT max(t.scheduled_at) FROM cron_ticks t WHERE t.workflow_id = w.id))
           AS decided_until
  FROM workflow_activations a
  JOIN workflows w ON w.id = a.workflow_id
  JOIN workflow_versions v ON v.id = a.version_id
 WHERE v.definition -> 'trigger' ->> 'cron' IS NOT NULL
 ORDER BY w.id

-- name: cron_tick_insert
-- The tick's one decision. No row back: another sweep decided this tick first (it may still
-- be committing; this statement waited for it), so this one does nothing more.
INSERT INTO cron_ticks (workflow_id, scheduled_at, status, detail)
VALUES (CAST(:workflow_id AS uuid), :scheduled_at, :status, :detail)
ON CONFLICT (workflow_id, scheduled_at) DO NOTHING
RETURNING scheduled_at

-- name: cron_tick_set_event
UPDATE cron_ticks SET event_id = :event_id
 WHERE workflow_id = CAST(:workflow_id AS uuid) AND scheduled_at = :scheduled_at

-- name: cron_ticks_list
-- A workflow's ticks, newest first (ops: "why didn't my 09:00 run happen?").
SELECT scheduled_at, status, event_id, detail, recorded_at
  FROM cron_ticks
 WHERE workflow_id = CAST(:workflow_id AS uuid)
   AND (CAST(:status AS text) IS NULL OR status = CAST(:status AS text))
 ORDER BY scheduled_at DESC
 LIMIT :limit

-- name: cron_ticks_summary
SELECT count(*) FILTER (WHERE status = 'fired') AS fired,
       count(*) FILTER (WHERE status = 'missed') AS missed,
       max(scheduled_at) AS last_decided
  FROM cron_ticks
 WHERE workflow_id = CAST(:workflow_id AS uuid)
