-- Webhook-trigger senders that sign with a shared secret (HMAC-SHA256 of the body, the way
-- GitHub and many billing systems do) rather than Standard Webhooks: provider 'hmac'. Such a
-- connection only ever addresses webhook triggers (shared/triggers/webhook.py).
ALTER TABLE connections DROP CONSTRAINT connections_provider_check;
ALTER TABLE connections ADD CONSTRAINT connections_provider_check
    CHECK (provider IN ('hubspot', 'standard', 'pipedrive', 'hmac'));
