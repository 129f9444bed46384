-- The provider app a connection's webhook subscriptions belong to (HubSpot: the public or
-- private app id in /webhooks/v3/{appId}/subscriptions). Null means subscriptions for this
-- connection can't be managed through the API.
ALTER TABLE connections ADD COLUMN provider_app_id text
    CHECK (provider_app_id IS NULL OR provider_app_id ~ '^[0-9]{1,20}$');
