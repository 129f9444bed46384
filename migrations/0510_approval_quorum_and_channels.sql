-- Approvals that reach people (issue 31, item 4): a quorum of named approvers, the channels
-- an approval is delivered through (a Slack message with buttons, an email with a signed
-- link), reminders and escalation, and the identities a Slack click or an email maps to.

-- Quorum: `required` approving votes resume the step approved; `reject_quorum` rejecting votes
-- resume it rejected (1: a reject by anyone ends it). The default 1/1 is the first release's
-- "first decision wins".
ALTER TABLE step_parks
    ADD COLUMN required integer NOT NULL DEFAULT 1 CHECK (required BETWEEN 1 AND 50),
    ADD COLUMN reject_quorum integer NOT NULL DEFAULT 1 CHECK (reject_quorum BETWEEN 1 AND 50),
    -- Delivery: the Slack channel the approval is posted to (NULL: none); whether the named
    -- users are mailed a signed link.
    ADD COLUMN slack_channel text,
    ADD COLUMN email boolean NOT NULL DEFAULT false,
    -- A reminder to those who have not voted yet, once, at remind_at (reminded_at says it was
    -- sent); escalation once at escalate_at: escalate_role / escalate_users may then decide
    -- too (escalated_at says since when), and are asked.
    ADD COLUMN remind_at timestamptz,
    ADD COLUMN reminded_at timestamptz,
    ADD COLUMN escalate_at timestamptz,
    ADD COLUMN escalate_role text,
    ADD COLUMN escalate_users text[] NOT NULL DEFAULT '{}',
    ADD COLUMN escalated_at timestamptz,
    ADD CONSTRAINT parks_escalation_names_someone CHECK (escalate_at IS NULL
        OR escalate_role IS NOT NULL OR cardinality(escalate_users) > 0),
    ADD CONSTRAINT parks_reminded_only_if_asked CHECK (reminded_at IS NULL OR remind_at IS NOT NULL),
    ADD CONSTRAINT parks_escalated_only_if_asked
        CHECK (escalated_at IS NULL OR escalate_at IS NOT NULL);
-- The sweep's reminder and escalation repair reads what is due from these, not a scan.
CREATE INDEX step_parks_remind_due ON step_parks (remind_at)
    WHERE kind = 'approval' AND resumed_at IS NULL AND reminded_at IS NULL
      AND remind_at IS NOT NULL;
CREATE INDEX step_parks_escalate_due ON step_parks (escalate_at)
    WHERE kind = 'approval' AND resumed_at IS NULL AND escalated_at IS NULL
      AND escalate_at IS NOT NULL;

-- One vote per approver per approval (the primary key: a second click by the same person,
-- a redelivered Slack interaction, changes nothing). `counted` is false for a vote that came
-- after the approval closed (quorum reached, expired, run ended): kept as the record of a
-- late click, never a second resume.
CREATE TABLE approval_votes (
    park_id     bigint NOT NULL REFERENCES step_parks (id) ON DELETE CASCADE,
    tenant_id   text NOT NULL REFERENCES tenants (id),
    voter       text NOT NULL,
    decision    text NOT NULL CHECK (decision IN ('approved', 'rejected')),
    via         text NOT NULL CHECK (via IN ('ops', 'link', 'slack', 'email')),
    comment     text,
    counted     boolean NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (park_id, voter)
);

-- Who a Slack user id or an email address is, per tenant: the onceflow user (the label the
-- approvals name; their roles are those of the user's live ops tokens). A click is trusted
-- only as far as this says: the verified Slack user id is looked up here, nothing else in
-- the click names anyone.
CREATE TABLE approver_identities (
    tenant_id     text NOT NULL REFERENCES tenants (id),
    channel       text NOT NULL CHECK (channel IN ('slack', 'email')),
    external_id   text NOT NULL CHECK (length(external_id) BETWEEN 1 AND 320),
    onceflow_user text NOT NULL CHECK (length(onceflow_user) BETWEEN 1 AND 200),
    created_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, channel, external_id)
);
CREATE INDEX approver_identities_user ON approver_identities (tenant_id, onceflow_user, channel);

-- Per-tenant Slack settings, next to its other outbound settings (signing_secret_env): the
-- names of the variables (Secret Manager in the cloud) holding the bot token and the app's
-- signing secret. NULL: the tenant has no Slack.
ALTER TABLE tenants
    ADD COLUMN slack_bot_token_env text CHECK (slack_bot_token_env ~ '^[A-Z][A-Z0-9_]{0,99}$'),
    ADD COLUMN slack_signing_secret_env text
        CHECK (slack_signing_secret_env ~ '^[A-Z][A-Z0-9_]{0,99}$');

-- The messages an approval sends (the ask, a reminder, an escalation; Slack or email), sent
-- by the sweep, never inline: a decision answers Slack at once, and the message's update
-- ("approved by …") is queued here (update_due_at) for the sweep to make. `due_at` is when
-- the next send attempt is due (moved forward by each claim: a crashed sender's claim lapses).
CREATE TABLE approval_messages (
    id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    park_id        bigint NOT NULL REFERENCES step_parks (id) ON DELETE CASCADE,
    tenant_id      text NOT NULL REFERENCES tenants (id),
    channel        text NOT NULL CHECK (channel IN ('slack', 'email')),
    purpose        text NOT NULL CHECK (purpose IN ('ask', 'remind', 'escalate')),
    -- A Slack channel id, or an onceflow user (email: mailed at their mapped address).
    recipient      text NOT NULL,
    due_at         timestamptz,
    sent_at        timestamptz,
    -- Slack: the posted message's channel and ts (chat.update names them).
    slack_ts       text,
    slack_channel  text,
    -- A vote or the decision changed what the posted message should say: due for chat.update
    -- (the sweep clears it when it makes the update; a later vote sets it again).
    update_due_at  timestamptz,
    updated_at     timestamptz,
    attempts       integer NOT NULL DEFAULT 0,
    last_error     text,
    created_at     timestamptz NOT NULL DEFAULT now(),
    UNIQUE (park_id, channel, purpose, recipient),
    -- A sent message is due no more; an unsent one without a due time was given up (after
    -- its last attempt, `last_error` says why).
    CONSTRAINT approval_messages_sent_is_not_due CHECK (sent_at IS NULL OR due_at IS NULL)
);
CREATE INDEX approval_messages_due ON approval_messages (due_at)
    WHERE sent_at IS NULL AND due_at IS NOT NULL;
-- An update is made only of a posted message: one due before its post was sent (a vote while
-- the post was in flight) waits here for the post, then is made.
CREATE INDEX approval_messages_update_due ON approval_messages (update_due_at)
    WHERE update_due_at IS NOT NULL AND sent_at IS NOT NULL;
CREATE INDEX approval_messages_park ON approval_messages (park_id);
