-- Provider apps (one webhook URL for many portals), routing their events to connections, and
-- the events no connection took.

-- name: provider_app_get
SELECT provider, app_id, kind, client_secret_env, developer_credential_env, signature_versions,
       api_base_url, oauth_client_id_env, oauth_scopes, oauth_authorize_url, platform,
       project_declared, project_declared_at
  FROM provider_apps
 WHERE provider = :provider AND app_id = :app_id

-- name: provider_app_upsert
-- Registering an app again updates where its secrets live (rotation is a new env var name).
INSERT INTO provider_apps (provider, app_id, kind, client_secret_env, developer_credential_env,
                           signature_versions, api_base_url, oauth_client_id_env,
                           oauth_scopes, oauth_authorize_url, platform)
VALUES (:provider, :app_id, :kind, :client_secret_env, :developer_credential_env,
        CAST(:signature_versions AS text[]), :api_base_url, :oauth_client_id_env,
        CAST(:oauth_scopes AS text[]), :oauth_authorize_url, :platform)
ON CONFLICT (provider, app_id) DO UPDATE
   SET kind = EXCLUDED.kind, client_secret_env = EXCLUDED.client_secret_env,
       developer_credential_env = EXCLUDED.developer_credential_env,
       signature_versions = EXCLUDED.signature_versions, api_base_url = EXCLUDED.api_base_url,
       oauth_client_id_env = EXCLUDED.oauth_client_id_env,
       oauth_scopes = EXCLUDED.oauth_scopes, oauth_authorize_url = EXCLUDED.oauth_authorize_url,
       platform = EXCLUDED.platform,
       -- A declaration belongs to a project: an app moved back to legacy has none.
       project_declared = CASE WHEN EXCLUDED.platform = 'project'
                               THEN provider_apps.project_declared END,
       project_declared_at = CASE WHEN EXCLUDED.platform = 'project'
                                  THEN provider_apps.project_declared_at END

-- name: provider_app_project_declared
-- What the app's project files declare, as `onceflow <provider> project` read them back after
-- writing them (shared/publishing/subscriptions.py record_project_declaration). Guarded on a
-- project app: a legacy app's subscriptions are the provider's API's, never a file's; zero rows
-- means no such app, or not a project app. The last write wins: it is the latest files.
UPDATE provider_apps
   SET project_declared = CAST(:declared AS jsonb), project_declared_at = now()
 WHERE provider = :provider AND app_id = :app_id AND platform = 'project'
RETURNING project_declared_at

-- name: provider_app_live_connections
-- The live (not disconnected) connection of each account of the app, for routing one batch.
-- The unique index connections_app_account makes it at most one per account.
SELECT provider_account_id AS account_id, id::text AS connection_id
  FROM connections
 WHERE provider = :provider AND provider_app_id = :app_id
   AND provider_account_id = ANY(CAST(:accounts AS text[]))
   AND status <> 'disconnected'

-- name: provider_app_record_unrouted
-- In the drain's transaction. The same event delivered again (a HubSpot retry of the batch)
-- counts as one more delivery of the row, not a second row.
INSERT INTO unrouted_provider_events (provider, app_id, account_id, reason, source_event_id,
                                      event_type, payload, inbox_id)
VALUES (:provider, :app_id, :account_id, :reason, :source_event_id, :event_type,
        CAST(:payload AS jsonb), :inbox_id)
ON CONFLICT (provider, app_id, account_id, source_event_id) DO UPDATE
   SET deliveries = unrouted_provider_events.deliveries + 1, last_seen_at = now(),
       inbox_id = EXCLUDED.inbox_id, reason = EXCLUDED.reason

-- name: provider_app_unrouted_summary
-- Ops, per app: which portals send events nobody takes, how many, since when, and why
-- (events the sweep re-routed to a connection since are taken).
SELECT account_id, reason, count(*) AS events, sum(deliveries) AS deliveries,
       min(first_seen_at) AS first_seen_at, max(last_seen_at) AS last_seen_at
  FROM unrouted_provider_events
 WHERE provider = :provider AND app_id = :app_id AND rerouted_at IS NULL
 GROUP BY account_id, reason
 ORDER BY max(last_seen_at) DESC

-- name: provider_app_reroute_claim
-- The sweep's re-routing (shared/ingest/inbox.py reroute_unrouted): events recorded because their
-- portal had no live connection, whose portal has one now, first seen at most
-- `lookback_seconds` before that connection was created (the events of the install that
-- created it, which HubSpot sends from consent on; older ones predate it and stay for ops).
-- Claimed and stamped in one guarded statement, in the transaction that also writes their
-- trigger events: SKIP LOCKED lets two sweeps share the backlog, and `rerouted_at IS NULL`
-- means a row already stamped (committed by another pass) is zero rows here, so each event is
-- re-routed at most once, and only if its trigger events commit with it.
WITH waiting AS (
    SELECT u.id, c.id AS connection_id
      FROM unrouted_provider_events u
      JOIN connections c
        ON c.provider = u.provider AND c.provider_app_id = u.app_id
       AND c.provider_account_id = u.account_id AND c.status <> 'disconnected'
     WHERE u.rerouted_at IS NULL AND u.reason = 'no_live_connection'
       AND u.first_seen_at
           >= c.created_at - make_interval(secs => CAST(:lookback_seconds AS double precision))
     ORDER BY u.id
     LIMIT CAST(:batch AS integer)
       FOR UPDATE OF u SKIP LOCKED
)
UPDATE unrouted_provider_events u
   SET rerouted_at = now(), rerouted_to = w.connection_id
  FROM waiting w
 WHERE u.id = w.id AND u.rerouted_at IS NULL
RETURNING u.id, u.provider, u.inbox_id, u.payload, CAST(w.connection_id AS text) AS connection_id
