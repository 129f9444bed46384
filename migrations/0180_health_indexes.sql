-- The health view (shared/sweep/backlog.py) counts dead inbox rows and given-up trigger events on
-- every call; without these the counts scan the whole inbox and outbox, which only grow.
CREATE INDEX webhook_inbox_dead ON webhook_inbox (finished_at) WHERE status = 'dead';
CREATE INDEX workflow_trigger_events_undelivered
    ON workflow_trigger_events (undelivered_at) WHERE undelivered_at IS NOT NULL;
