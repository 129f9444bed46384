-- Events of a portal that had no live connection yet can be routed once its connection exists
-- (issue 23, item 16). HubSpot installs the app on a portal at consent and delivers its events
-- from then on, while the portal's connection appears only when the install is confirmed
-- (shared/accounts/oauth_install.py); before this, those events stayed in unrouted_provider_events for
-- good. The sweep (shared/ingest/inbox.py reroute_unrouted) drains each one into the connection's
-- trigger events and stamps it here in the same transaction: rerouted_at and rerouted_to are
-- set together, once.
ALTER TABLE unrouted_provider_events
    ADD COLUMN rerouted_at timestamptz,
    ADD COLUMN rerouted_to uuid REFERENCES connections (id),
    ADD CONSTRAINT unrouted_provider_events_rerouted_whole
        CHECK ((rerouted_at IS NULL) = (rerouted_to IS NULL)),
    ADD CONSTRAINT unrouted_provider_events_rerouted_had_no_connection
        CHECK (rerouted_at IS NULL OR reason = 'no_live_connection');
-- What the sweep looks for: events still waiting for their portal's connection.
CREATE INDEX unrouted_provider_events_waiting
    ON unrouted_provider_events (provider, app_id, account_id)
    WHERE rerouted_at IS NULL AND reason = 'no_live_connection';
