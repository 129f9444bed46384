-- Webhook triggers (POST /{provider}/{connection_id}/{workflow}: shared/triggers/webhook.py).

-- Idempotency keys: the occurrence a key names, for as long as its TTL. The primary key is the
-- claim: a duplicate POST within the TTL meets the row and is answered with `event_id`; after
-- the TTL the same key is claimed again as a new generation (a new occurrence).
CREATE TABLE webhook_trigger_keys (
    workflow_id  uuid NOT NULL REFERENCES workflows (id),
    key          text NOT NULL CHECK (length(key) BETWEEN 1 AND 512),
    generation   integer NOT NULL DEFAULT 1 CHECK (generation > 0),
    event_id     bigint REFERENCES workflow_trigger_events (id),
    claimed_at   timestamptz NOT NULL DEFAULT now(),
    expires_at   timestamptz NOT NULL,
    PRIMARY KEY (workflow_id, key)
);
-- Expired keys are only answered again by a new claim; the sweep deletes them in batches.
CREATE INDEX webhook_trigger_keys_expiry ON webhook_trigger_keys (expires_at);

-- Requests a webhook trigger refused after verifying them (the key expression failed on the
-- request, or gave no usable key): the sender got a 4xx, and a person can see why here.
CREATE TABLE webhook_trigger_refusals (
    id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    workflow_id    uuid NOT NULL REFERENCES workflows (id),
    connection_id  uuid NOT NULL REFERENCES connections (id),
    reason         text NOT NULL CHECK (reason IN ('idempotency_key_failed', 'body_unreadable')),
    detail         text NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX webhook_trigger_refusals_workflow ON webhook_trigger_refusals (workflow_id, created_at);
