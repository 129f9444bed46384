-- Subscriptions belong to the app, not to a connection (issue 13, item 2): every portal that
-- installs a HubSpot app gets the same ones, so the desired set is the union over the app's
-- active connections and it is reconciled once per app, with the app's developer credential.
-- Reconciling per connection made two connections of one app delete each other's
-- subscriptions. The last outcome per app, as subscription_reconciles keeps it per connection.
CREATE TABLE app_subscription_reconciles (
    provider       text NOT NULL,
    app_id         text NOT NULL,
    desired        jsonb NOT NULL,
    result         jsonb NOT NULL,
    ok             boolean NOT NULL,
    reconciled_at  timestamptz NOT NULL,
    PRIMARY KEY (provider, app_id),
    FOREIGN KEY (provider, app_id) REFERENCES provider_apps (provider, app_id)
);
