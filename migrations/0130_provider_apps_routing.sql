-- App-level provider webhooks (issue 13). A HubSpot app has ONE webhook URL for every portal
-- that installed it, and its subscriptions are app-level
-- (https://developers.hubspot.com/docs/api/webhooks): a batch mixes portals, told apart by
-- each event's portalId. So the app, not the connection, is what a delivery is verified
-- against, and each event is routed to its connection by (appId, portalId) when drained.

-- A provider app. Like connections, it names the environment variables (filled from Secret
-- Manager) that hold its secrets, never the secrets.
CREATE TABLE provider_apps (
    provider                 text NOT NULL CHECK (provider IN ('hubspot')),
    app_id                   text NOT NULL CHECK (app_id ~ '^[0-9]{1,20}$'),
    -- public: installed through OAuth on many portals, subscriptions managed through the API;
    -- private: one portal, webhook settings only in HubSpot's UI.
    kind                     text NOT NULL DEFAULT 'public' CHECK (kind IN ('public', 'private')),
    -- The app's client secret: the key of X-HubSpot-Signature-v3.
    client_secret_env        text NOT NULL CHECK (client_secret_env ~ '^[A-Z][A-Z0-9_]*$'),
    -- The developer credential the subscriptions API takes (not a portal's CRM token).
    developer_credential_env text CHECK (developer_credential_env ~ '^[A-Z][A-Z0-9_]*$'),
    signature_versions       text[] NOT NULL DEFAULT '{v3}',
    api_base_url             text,
    created_at               timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (provider, app_id)
);

-- An inbox row comes either from a connection's own URL (as before) or from an app's URL; the
-- app's batch is stored once, as HubSpot sent it, and split per connection when drained.
ALTER TABLE webhook_inbox ALTER COLUMN connection_id DROP NOT NULL;
ALTER TABLE webhook_inbox ADD COLUMN app_provider text, ADD COLUMN app_id text;
ALTER TABLE webhook_inbox
    ADD CONSTRAINT inbox_app_fk FOREIGN KEY (app_provider, app_id)
        REFERENCES provider_apps (provider, app_id),
    ADD CONSTRAINT inbox_connection_or_app
        CHECK ((connection_id IS NULL) <> (app_id IS NULL)
               AND (app_id IS NULL) = (app_provider IS NULL));
-- An app's byte-identical redelivery is the same row, as for a connection.
CREATE UNIQUE INDEX webhook_inbox_app_body ON webhook_inbox (app_provider, app_id, body_sha256)
    WHERE app_id IS NOT NULL;

-- Routing must be deterministic: one live connection per (app, portal).
CREATE UNIQUE INDEX connections_app_account ON connections
    (provider, provider_app_id, provider_account_id)
    WHERE status <> 'disconnected' AND provider_app_id IS NOT NULL
      AND provider_account_id IS NOT NULL;

-- Events of an app's batch that no live connection takes: kept (never silently dropped) per
-- app and portal for ops, and acknowledged to the provider (a 5xx would only make it retry
-- the whole batch for a day). A redelivery of the same event counts here, not a new row.
CREATE TABLE unrouted_provider_events (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    provider        text NOT NULL,
    app_id          text NOT NULL,
    account_id      text NOT NULL,  -- HubSpot portalId ('' when the event carried none)
    reason          text NOT NULL
                    CHECK (reason IN ('no_live_connection', 'other_app', 'no_account')),
    source_event_id text NOT NULL,
    event_type      text NOT NULL,
    payload         jsonb NOT NULL,
    inbox_id        bigint NOT NULL REFERENCES webhook_inbox (id),
    deliveries      integer NOT NULL DEFAULT 1,
    first_seen_at   timestamptz NOT NULL DEFAULT now(),
    last_seen_at    timestamptz NOT NULL DEFAULT now(),
    FOREIGN KEY (provider, app_id) REFERENCES provider_apps (provider, app_id),
    UNIQUE (provider, app_id, account_id, source_event_id)
);
CREATE INDEX unrouted_provider_events_recent
    ON unrouted_provider_events (provider, app_id, last_seen_at DESC);
