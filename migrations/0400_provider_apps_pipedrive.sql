-- Pipedrive Marketplace apps (issue 28): an app installed with OAuth on Pipedrive companies
-- is a provider app like a HubSpot public app (its OAuth client, shared/providers/install.py).
-- Its connections' ports refresh through the app's client (shared/providers/connect.py).
ALTER TABLE provider_apps DROP CONSTRAINT provider_apps_provider_check;
ALTER TABLE provider_apps ADD CONSTRAINT provider_apps_provider_check
    CHECK (provider IN ('hubspot', 'pipedrive'));
