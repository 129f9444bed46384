-- The health view (shared/backlog.py) counts dead inbox rows on every call; without this the
-- count scans the whole inbox, which only grows.
CREATE INDEX webhook_inbox_dead ON webhook_inbox (finished_at) WHERE status = 'dead';
