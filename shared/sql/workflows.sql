-- Workflows, immutable versions, activations and trigger bindings.

-- name: workflows_tenant_exists
SELECT EXISTS (SELECT 1 FROM tenants WHERE id = :tenant_id)

-- name: workflows_upsert_locked
-- Creates the workflow on first publish; the no-op DO UPDATE takes the row lock, so two
-- concurrent publishes of one workflow number their versions one after the other.
INSERT INTO workflows (tenant_id, name) VALUES (:tenant_id, :name)
ON CONFLICT (tenant_id, name) DO UPDATE SET name = EXCLUDED.name
RETURNING id::text AS id

-- name: workflows_lock_for_tenant
-- A tenant only ever touches its own workflows: the tenant is part of the key.
SELECT id::text AS id FROM workflows
 WHERE id = CAST(:workflow_id AS uuid) AND tenant_id = :tenant_id
   FOR UPDATE

-- name: workflows_version_by_hash
SELECT id::text AS id, number FROM workflow_versions
 WHERE workflow_id = CAST(:workflow_id AS uuid) AND content_hash = :content_hash

-- name: workflows_version_insert
-- Numbered under the workflow row lock taken by workflows_upsert_locked.
INSERT INTO workflow_versions (workflow_id, number, content_hash, definition, source_text)
SELECT CAST(:workflow_id AS uuid), COALESCE(max(number), 0) + 1, :content_hash,
       CAST(:definition AS jsonb), :source_text
  FROM workflow_versions WHERE workflow_id = CAST(:workflow_id AS uuid)
RETURNING id::text AS id, number

-- name: workflows_version_get
SELECT v.id::text AS id, v.workflow_id::text AS workflow_id, w.tenant_id, v.number,
       v.content_hash, v.definition, v.created_at
  FROM workflow_versions v JOIN workflows w ON w.id = v.workflow_id
 WHERE v.id = CAST(:version_id AS uuid)

-- name: workflows_versions_list
SELECT v.id::text AS id, v.number, v.content_hash, v.created_at,
       (a.version_id IS NOT NULL) AS active
  FROM workflow_versions v
  LEFT JOIN workflow_activations a ON a.version_id = v.id
 WHERE v.workflow_id = CAST(:workflow_id AS uuid)
 ORDER BY v.number

-- name: workflows_activation_upsert
INSERT INTO workflow_activations (workflow_id, version_id)
VALUES (CAST(:workflow_id AS uuid), CAST(:version_id AS uuid))
ON CONFLICT (workflow_id) DO UPDATE SET version_id = EXCLUDED.version_id, activated_at = now()

-- name: workflows_activation_delete
DELETE FROM workflow_activations WHERE workflow_id = CAST(:workflow_id AS uuid)

-- name: workflows_active_version
SELECT version_id::text AS version_id FROM workflow_activations
 WHERE workflow_id = CAST(:workflow_id AS uuid)

-- name: workflows_bindings_delete
DELETE FROM trigger_bindings WHERE workflow_id = CAST(:workflow_id AS uuid)

-- name: workflows_bindings_insert
INSERT INTO trigger_bindings (tenant_id, event_type, workflow_id, version_id, dedup_mode)
SELECT :tenant_id, e.event_type, CAST(:workflow_id AS uuid), CAST(:version_id AS uuid),
       :dedup_mode
  FROM unnest(CAST(:event_types AS text[])) AS e (event_type)

-- name: workflows_bindings_for_event
-- Matching an event is this one range scan on trigger_bindings' primary key.
SELECT workflow_id::text AS workflow_id, version_id::text AS version_id, dedup_mode
  FROM trigger_bindings
 WHERE tenant_id = :tenant_id AND event_type = :event_type
 ORDER BY workflow_id

-- name: workflows_active_definitions
-- The definitions of every active version, for subscription reconciles.
SELECT w.tenant_id, a.workflow_id::text AS workflow_id, a.version_id::text AS version_id,
       v.definition
  FROM workflow_activations a
  JOIN workflows w ON w.id = a.workflow_id
  JOIN workflow_versions v ON v.id = a.version_id
 WHERE w.tenant_id = :tenant_id
 ORDER BY w.name

-- name: workflows_reconcile_connections
-- Connections whose provider subscriptions the hourly sweep keeps in line one by one: those of
-- a registered provider app are reconciled per app instead (workflows_app_reconcile_apps).
-- A service key has no webhooks to reconcile: "Service Keys do not support webhooks"
-- (https://developers.hubspot.com/changelog/service-keys); its portal's events come through
-- an app, and calling the subscriptions API with it would only be refused every hour.
SELECT c.id::text AS id, c.tenant_id, c.provider
  FROM connections c
 WHERE c.status = 'active' AND c.credential_kind <> 'service_key'
   AND NOT EXISTS (SELECT 1 FROM provider_apps p
                    WHERE p.provider = c.provider AND p.app_id = c.provider_app_id)
 ORDER BY c.id

-- name: workflows_reconcile_connection_get
SELECT c.id::text AS id, c.tenant_id, c.provider, c.status,
       EXISTS (SELECT 1 FROM provider_apps p
                WHERE p.provider = c.provider AND p.app_id = c.provider_app_id) AS app_registered
  FROM connections c
 WHERE c.id = CAST(:connection_id AS uuid)

-- name: workflows_reconcile_record
INSERT INTO subscription_reconciles (connection_id, desired, result, ok, reconciled_at)
VALUES (CAST(:connection_id AS uuid), CAST(:desired AS jsonb), CAST(:result AS jsonb), :ok, now())
ON CONFLICT (connection_id) DO UPDATE
   SET desired = EXCLUDED.desired, result = EXCLUDED.result, ok = EXCLUDED.ok,
       reconciled_at = EXCLUDED.reconciled_at

-- name: workflows_reconcile_last
SELECT desired, result, ok, reconciled_at
  FROM subscription_reconciles
 WHERE connection_id = CAST(:connection_id AS uuid)

-- name: workflows_app_reconcile_apps
-- Apps whose subscriptions the hourly sweep keeps in line (one reconcile per app).
SELECT provider, app_id
  FROM provider_apps
 ORDER BY provider, app_id

-- name: workflows_app_active_tenants
-- The tenants of the app's active connections: their active triggers make the app's union.
SELECT DISTINCT tenant_id
  FROM connections
 WHERE provider = :provider AND provider_app_id = :app_id AND status = 'active'
 ORDER BY tenant_id

-- name: workflows_app_reconcile_record
INSERT INTO app_subscription_reconciles (provider, app_id, desired, result, ok, reconciled_at)
VALUES (:provider, :app_id, CAST(:desired AS jsonb), CAST(:result AS jsonb), :ok, now())
ON CONFLICT (provider, app_id) DO UPDATE
   SET desired = EXCLUDED.desired, result = EXCLUDED.result, ok = EXCLUDED.ok,
       reconciled_at = EXCLUDED.reconciled_at

-- name: workflows_app_reconcile_last
SELECT desired, result, ok, reconciled_at
  FROM app_subscription_reconciles
 WHERE provider = :provider AND app_id = :app_id

-- name: workflows_tenant_reconcile_targets
-- The tenant's active connections, with the registered app each belongs to (NULL: none, so
-- it is reconciled on its own), for reconciling right after an activation changes.
SELECT c.id::text AS id, c.provider, p.app_id
  FROM connections c
  LEFT JOIN provider_apps p ON p.provider = c.provider AND p.app_id = c.provider_app_id
 WHERE c.tenant_id = :tenant_id AND c.status = 'active'
 ORDER BY c.id
