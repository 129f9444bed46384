-- How old the oldest unfinished work is, per queue. Each subquery reads one small partial
-- index (the "not handled yet" rows), so this stays cheap however large the tables grow.

-- name: backlog_ages
-- Ages in seconds (0 when the queue is empty) and row counts. Steps: pending steps never
-- claimed, aged from their creation: one that waits long means step-ready delivery is stuck
-- (a step put back to pending by the sweep has started_at set and shows in lease alerts).
WITH inbox AS (
    SELECT count(*) AS n, min(received_at) AS oldest
    FROM webhook_inbox WHERE status = 'pending'
), outbox AS (
    SELECT count(*) AS n, min(created_at) AS oldest
    FROM workflow_trigger_events WHERE published_at IS NULL
), steps AS (
    SELECT count(*) AS n, min(s.created_at) AS oldest
    FROM workflow_steps s JOIN workflow_runs r ON r.id = s.run_id
    WHERE s.status = 'pending' AND s.started_at IS NULL AND r.namespace = 'live'
)
SELECT inbox.n AS inbox_pending,
       coalesce(extract(epoch FROM now() - inbox.oldest), 0)::float8 AS inbox_oldest_seconds,
       outbox.n AS outbox_unpublished,
       coalesce(extract(epoch FROM now() - outbox.oldest), 0)::float8 AS outbox_oldest_seconds,
       steps.n AS steps_pending,
       coalesce(extract(epoch FROM now() - steps.oldest), 0)::float8
           AS steps_oldest_pending_seconds
FROM inbox, outbox, steps

-- name: dead_letter_counts
-- What was put aside because it can never succeed: poisoned Pub/Sub messages (all time and
-- the last 24 hours), inbox rows that ran out of attempts, and trigger events the sweep gave
-- up re-publishing (ops can re-queue them). The last two read partial indexes (0180).
SELECT (SELECT count(*) FROM poisoned_messages) AS poisoned_messages,
       (SELECT count(*) FROM poisoned_messages
        WHERE received_at > now() - interval '24 hours') AS poisoned_messages_24h,
       (SELECT count(*) FROM webhook_inbox WHERE status = 'dead') AS dead_inbox_rows,
       (SELECT count(*) FROM workflow_trigger_events
        WHERE undelivered_at IS NOT NULL) AS undelivered_events
