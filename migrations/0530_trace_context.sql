-- OpenTelemetry (issue 30, item 5): one trace per event, from the webhook to the run's last
-- step, even when a step runs hours later (after a wait, a delay, a sweep redispatch).
--
-- Each row the event causes records the W3C `traceparent` of the span that wrote it: the inbox
-- row (the webhook's span), the trigger event (the drain's), the run and its steps
-- (admission's, then each step's). The step that runs next reads its row's context and its
-- span continues the trace, whichever instance runs it and however late.
--
-- The value comes from the transaction, not from each INSERT: shared/core/tracing.py `stamp`
-- sets the transaction-local `onceflow.trace_context` when tracing is on, and the default
-- below reads it. So the inserts (and the helpers of other features that add rows) stay as
-- they are, and with tracing off nothing is sent and the columns stay NULL.
-- `current_setting(…, true)` is NULL when the setting was never defined in the session and ''
-- after a transaction that set it ended: both mean "no context".
ALTER TABLE webhook_inbox
    ADD COLUMN trace_context text
    DEFAULT nullif(current_setting('onceflow.trace_context', true), '');
ALTER TABLE workflow_trigger_events
    ADD COLUMN trace_context text
    DEFAULT nullif(current_setting('onceflow.trace_context', true), '');
ALTER TABLE workflow_runs
    ADD COLUMN trace_context text
    DEFAULT nullif(current_setting('onceflow.trace_context', true), '');
ALTER TABLE workflow_steps
    ADD COLUMN trace_context text
    DEFAULT nullif(current_setting('onceflow.trace_context', true), '');
