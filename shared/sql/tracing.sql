-- Trace context stored with the rows an event causes (migrations/0530_trace_context.sql).
-- Run only when tracing is on (shared/core/tracing.py).

-- name: tracing_stamp
-- Transaction-local: the rows this transaction inserts record this context (the columns'
-- default reads it); it ends with the transaction, so a pooled connection carries nothing over.
SELECT set_config('onceflow.trace_context', :context, true) AS context

-- name: tracing_inbox_context
SELECT trace_context FROM webhook_inbox WHERE id = :id

-- name: tracing_event_context
SELECT trace_context FROM workflow_trigger_events WHERE id = :id

-- name: tracing_step_context
-- The step's own context; else its run's; else its trigger event's. A step row written
-- outside any span (a debounced or queued run started by the sweep, a replay started from
-- ops) still joins the trace of the event that caused its run.
SELECT coalesce(s.trace_context, r.trace_context, e.trace_context) AS trace_context
FROM workflow_steps s
JOIN workflow_runs r ON r.id = s.run_id
LEFT JOIN workflow_trigger_events e ON e.id = r.event_id
WHERE s.id = CAST(:id AS uuid)
