-- A posted Slack ask that still shows its approval open (with its buttons): when the approval
-- closes without a vote in it — its deadline, its run cancelled or ended — the sweep updates
-- the message too (shared/steps/approval_messages.py), found from this small partial index
-- (the posted asks of approvals that were open when last shown).
ALTER TABLE approval_messages ADD COLUMN shows_open boolean NOT NULL DEFAULT false;
CREATE INDEX approval_messages_shows_open ON approval_messages (park_id)
    WHERE shows_open AND sent_at IS NOT NULL;
