-- Dead-letter redrive is a bulk action too (issue 30, item 3): its preview names the held
-- Pub/Sub messages (`<hold>:<event or step id>`), an admin's only (tenant_id NULL).
ALTER TABLE ops_bulk_previews DROP CONSTRAINT ops_bulk_previews_action_check;
ALTER TABLE ops_bulk_previews ADD CONSTRAINT ops_bulk_previews_action_check
    CHECK (action IN ('replay', 'retry', 'cancel', 'requeue_inbox', 'redrive'));
