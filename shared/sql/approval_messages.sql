-- The approval messages the sweep sends (shared/steps/approval_messages.py).

-- name: approval_messages_claim_sends
-- The messages due to be sent, claimed by moving their due time past the send's timeout
-- (`lease_seconds`): a sweep that crashes mid-send leaves a claim that lapses, and a second
-- sweep skips rows the first has locked. Guarded on `sent_at IS NULL` and a due time that has
-- come: zero rows, nothing due.
UPDATE approval_messages m
SET due_at = now() + make_interval(secs => CAST(:lease_seconds AS double precision)),
    attempts = m.attempts + 1
FROM (SELECT id FROM approval_messages
      WHERE sent_at IS NULL AND due_at <= now()
      ORDER BY due_at
      LIMIT CAST(:batch AS integer)
      FOR UPDATE SKIP LOCKED) due, tenants t
WHERE m.id = due.id AND t.id = m.tenant_id AND m.sent_at IS NULL
RETURNING m.id, m.park_id, m.tenant_id, m.channel, m.purpose, m.recipient,
          t.slack_bot_token_env, t.smtp_host, t.smtp_port, t.smtp_from, t.smtp_username,
          t.smtp_password_env, t.smtp_starttls,
          -- an email's address: the recipient user's mapped address (the first, if several)
          (SELECT min(i.external_id) FROM approver_identities i
           WHERE i.tenant_id = m.tenant_id AND i.channel = 'email'
             AND i.onceflow_user = m.recipient) AS email_address

-- name: approval_messages_sent
-- A message was sent: recorded once (guarded on sent_at IS NULL; zero rows: another sweep's
-- lapsed claim sent it too, and this answer is dropped). A vote that came while it was being
-- posted left update_due_at set: now that it is sent, that update is made (the index).
UPDATE approval_messages
SET sent_at = now(), due_at = NULL, slack_ts = CAST(:slack_ts AS text),
    slack_channel = CAST(:slack_channel AS text), last_error = NULL,
    shows_open = (channel = 'slack' AND purpose = 'ask')
WHERE id = CAST(:id AS bigint) AND sent_at IS NULL
RETURNING id

-- name: approval_messages_failed
-- A send failed: why, and when to try again (the claim's due time is replaced) — or, after
-- `max_attempts`, never (no due time: given up, `last_error` says why). Not `counted` (Slack
-- answered 429: wait and send, not a failure of the message): the claim's attempt is given
-- back, and it is never given up for that.
UPDATE approval_messages
SET due_at = CASE WHEN CAST(:counted AS boolean)
                       AND attempts >= CAST(:max_attempts AS integer) THEN NULL
                  ELSE now() + make_interval(secs => CAST(:retry_seconds AS double precision))
             END,
    attempts = attempts - CASE WHEN CAST(:counted AS boolean) THEN 0 ELSE 1 END,
    last_error = CAST(:error AS text)
WHERE id = CAST(:id AS bigint) AND sent_at IS NULL

-- name: approval_messages_claim_updates
-- Posted messages whose update is due — a vote or the decision asked for it (update_due_at),
-- or the approval closed without one (its deadline, a cancel) while the message still shows
-- it open — claimed by clearing update_due_at and noting whether the approval is still open
-- (a vote after this sets update_due_at again, and the next pass renders the approval as it
-- is then). Each part is read from its partial index (approval_messages_update_due,
-- approval_messages_shows_open): both are small sets.
UPDATE approval_messages m
SET update_due_at = NULL, updated_at = now(), shows_open = (p.resumed_at IS NULL)
FROM (SELECT id FROM approval_messages
      WHERE id IN (SELECT id FROM approval_messages
                   WHERE update_due_at <= now() AND sent_at IS NOT NULL
                   UNION
                   SELECT o.id FROM approval_messages o JOIN step_parks op ON op.id = o.park_id
                   WHERE o.shows_open AND o.sent_at IS NOT NULL AND op.resumed_at IS NOT NULL)
      ORDER BY id
      LIMIT CAST(:batch AS integer)
      FOR UPDATE SKIP LOCKED) due, tenants t, step_parks p
WHERE m.id = due.id AND t.id = m.tenant_id AND p.id = m.park_id
RETURNING m.id, m.park_id, m.tenant_id, m.slack_ts, m.slack_channel, t.slack_bot_token_env

-- name: approval_messages_update_failed
-- An update failed: due again later (unless a newer vote already made it due sooner).
UPDATE approval_messages
SET update_due_at = least(coalesce(update_due_at, 'infinity'),
                          now() + make_interval(secs => CAST(:retry_seconds AS double precision))),
    last_error = CAST(:error AS text)
WHERE id = CAST(:id AS bigint)

-- name: approval_messages_view
-- What a message shows: the approval, its state, its votes, the posted ask (a reminder is a
-- reply in its thread), the members of its roles with a Slack id (migration 0600) and the
-- Slack ids of the users it names or its roles hold (to mention them).
SELECT p.id, p.summary, p.required, p.reject_quorum, p.deadline, p.decision, p.decided_by,
       p.email,
       p.resumed_at, p.resumed_by, p.approver_role, p.approver_users, p.escalated_at,
       p.escalate_role, p.escalate_users, m.role_members, m.escalate_role_members,
       (SELECT a.slack_ts FROM approval_messages a
        WHERE a.park_id = p.id AND a.channel = 'slack' AND a.purpose = 'ask') AS ask_ts,
       coalesce((SELECT jsonb_object_agg(i.onceflow_user, i.external_id)
                 FROM approver_identities i
                 WHERE i.tenant_id = p.tenant_id AND i.channel = 'slack'
                   AND i.onceflow_user = ANY (p.approver_users || p.escalate_users
                                             || m.role_members || m.escalate_role_members)),
                '{}'::jsonb) AS slack_ids,
       coalesce((SELECT jsonb_agg(jsonb_build_object('voter', v.voter, 'decision', v.decision,
                                                     'counted', v.counted)
                                  ORDER BY v.created_at, v.voter)
                 FROM approval_votes v WHERE v.park_id = p.id), '[]'::jsonb) AS votes
FROM step_parks p,
     LATERAL (SELECT onceflow_role_members(p.tenant_id, p.approver_role, 'slack') AS role_members,
                     onceflow_role_members(p.tenant_id, p.escalate_role, 'slack')
                         AS escalate_role_members) m
WHERE p.id = CAST(:park_id AS bigint)

-- name: approvals_remind_due
-- Approvals whose reminder is due, marked reminded and their reminder queued, in one
-- statement: guarded on `reminded_at IS NULL` and the approval still open, so each is reminded
-- at most once whatever sweeps run at once (a second finds it marked, or skips its lock). The
-- park row is locked FOR NO KEY UPDATE, which a vote's foreign key share lock does not wait
-- for, and no step row is taken: no lock cycle with a vote or a resume. Served by
-- step_parks_remind_due.
WITH due AS (
    UPDATE step_parks p SET reminded_at = now()
    FROM (SELECT id FROM step_parks
          WHERE kind = 'approval' AND resumed_at IS NULL AND reminded_at IS NULL
            AND remind_at IS NOT NULL AND remind_at <= now()
          ORDER BY remind_at
          LIMIT CAST(:batch AS integer)
          FOR NO KEY UPDATE SKIP LOCKED) d
    WHERE p.id = d.id AND p.reminded_at IS NULL AND p.resumed_at IS NULL
    RETURNING p.id, p.tenant_id, p.slack_channel, p.email,
              p.approver_users || onceflow_role_members(p.tenant_id, p.approver_role, 'email')
                  AS asked
), queued AS (
    INSERT INTO approval_messages (park_id, tenant_id, channel, purpose, recipient, due_at)
    SELECT id, tenant_id, 'slack', 'remind', slack_channel, now()
    FROM due WHERE slack_channel IS NOT NULL
    UNION ALL
    -- by email, those named or holding its role who have not voted
    SELECT DISTINCT due.id, due.tenant_id, 'email', 'remind', u.name, now()
    FROM due, unnest(due.asked) AS u (name)
    WHERE due.email AND NOT EXISTS (SELECT 1 FROM approval_votes v
                                    WHERE v.park_id = due.id AND v.voter = u.name)
    ON CONFLICT (park_id, channel, purpose, recipient) DO NOTHING
    RETURNING id
)
SELECT id FROM due

-- name: approvals_escalate_due
-- Approvals whose escalation is due: marked escalated (from then on `escalate_role` and
-- `escalate_users` may decide too: parks.may_decide), the escalation message queued and the
-- posted ask's update made due (it says who may now decide) — once, guarded as
-- approvals_remind_due is. Served by step_parks_escalate_due.
WITH due AS (
    UPDATE step_parks p SET escalated_at = now()
    FROM (SELECT id FROM step_parks
          WHERE kind = 'approval' AND resumed_at IS NULL AND escalated_at IS NULL
            AND escalate_at IS NOT NULL AND escalate_at <= now()
          ORDER BY escalate_at
          LIMIT CAST(:batch AS integer)
          FOR NO KEY UPDATE SKIP LOCKED) d
    WHERE p.id = d.id AND p.escalated_at IS NULL AND p.resumed_at IS NULL
    RETURNING p.id, p.tenant_id, p.slack_channel, p.email,
              p.escalate_users || onceflow_role_members(p.tenant_id, p.escalate_role, 'email')
                  AS added
), queued AS (
    INSERT INTO approval_messages (park_id, tenant_id, channel, purpose, recipient, due_at)
    SELECT id, tenant_id, 'slack', 'escalate', slack_channel, now()
    FROM due WHERE slack_channel IS NOT NULL
    UNION ALL
    SELECT DISTINCT due.id, due.tenant_id, 'email', 'escalate', u.name, now()
    FROM due, unnest(due.added) AS u (name)
    WHERE due.email
    ON CONFLICT (park_id, channel, purpose, recipient) DO NOTHING
    RETURNING id
), updated AS (
    UPDATE approval_messages m SET update_due_at = now()
    FROM due
    WHERE m.park_id = due.id AND m.channel = 'slack' AND m.purpose = 'ask'
    RETURNING m.id
)
SELECT id FROM due
