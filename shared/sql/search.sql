-- Finding a record the way people name it (shared/ops/search.py): a HubSpot record URL, an
-- object id or an email. Every statement is confined to :connection_ids, the caller's own
-- connections (ops_search_connections), so a tenant never finds another tenant's record.

-- name: search_connections
-- The caller's connections (all of them for an admin token), optionally only those of one
-- HubSpot portal (the number in a record URL).
SELECT id, tenant_id, provider, provider_account_id
FROM connections
WHERE (CAST(:tenant_id AS text) IS NULL OR tenant_id = CAST(:tenant_id AS text))
  AND (CAST(:account_id AS text) IS NULL OR provider_account_id = CAST(:account_id AS text))
ORDER BY created_at, id

-- name: search_connection_get
SELECT id, tenant_id, provider, provider_account_id
FROM connections
WHERE id = CAST(:connection_id AS uuid)

-- name: search_records_by_object_id
-- Records with this object id, from the events seen for them and the runs started for them
-- (a run's record key ends with ':<object id>'), newest first.
SELECT connection_id, object_type, object_id, max(seen_at) AS last_seen_at
FROM (
    SELECT e.connection_id, e.record_object_type AS object_type,
           e.record_object_id AS object_id, e.created_at AS seen_at
    FROM workflow_trigger_events e
    WHERE e.connection_id = ANY(CAST(:connection_ids AS uuid[]))
      AND e.record_object_id = :object_id
      AND (CAST(:object_type AS text) IS NULL OR e.record_object_type = CAST(:object_type AS text))
    UNION ALL
    SELECT CAST(split_part(r.record_key, ':', 1) AS uuid), split_part(r.record_key, ':', 2),
           :object_id, r.created_at
    FROM workflow_runs r
    WHERE r.namespace = 'live'
      AND r.tenant_id = ANY(CAST(:tenant_ids AS text[]))
      AND split_part(r.record_key, ':', 1) = ANY(CAST(:connection_id_texts AS text[]))
      AND right(r.record_key, length(:object_id) + 1) = ':' || :object_id
      AND (CAST(:object_type AS text) IS NULL
           OR split_part(r.record_key, ':', 2) = CAST(:object_type AS text))
) found
GROUP BY connection_id, object_type, object_id
ORDER BY max(seen_at) DESC
LIMIT :limit

-- name: search_records_by_email
-- Records whose email was seen: read or written by onceflow itself (`record_labels`, by
-- index: HubSpot's webhooks carry only the changed property, so this is where most emails
-- are), changed as a property (`changed_fields.email`), or held by the record a run's trigger
-- rule saw (any string value equal to the email, case aside). The last two are unindexed on
-- purpose: bounded by the tenant's rows, and a person's occasional lookup.
SELECT connection_id, object_type, object_id, max(seen_at) AS last_seen_at
FROM (
    SELECT l.connection_id, split_part(l.record_key, ':', 2) AS object_type,
           substr(l.record_key, length(split_part(l.record_key, ':', 1))
                                + length(split_part(l.record_key, ':', 2)) + 3) AS object_id,
           l.updated_at AS seen_at
    FROM record_labels l
    WHERE l.connection_id = ANY(CAST(:connection_ids AS uuid[])) AND l.email = :email
    UNION ALL
    SELECT e.connection_id, e.record_object_type AS object_type,
           e.record_object_id AS object_id, e.created_at AS seen_at
    FROM workflow_trigger_events e
    WHERE e.connection_id = ANY(CAST(:connection_ids AS uuid[]))
      AND e.record_object_id IS NOT NULL
      AND lower(e.changed_fields ->> 'email') = :email
    UNION ALL
    SELECT CAST(split_part(r.record_key, ':', 1) AS uuid), split_part(r.record_key, ':', 2),
           substr(r.record_key, length(split_part(r.record_key, ':', 1))
                                + length(split_part(r.record_key, ':', 2)) + 3),
           r.created_at
    FROM workflow_runs r
    WHERE r.namespace = 'live'
      AND r.tenant_id = ANY(CAST(:tenant_ids AS text[]))
      AND split_part(r.record_key, ':', 1) = ANY(CAST(:connection_id_texts AS text[]))
      AND r.trigger_record IS NOT NULL
      AND EXISTS (SELECT 1 FROM jsonb_path_query(r.trigger_record, '$.**') v
                  WHERE jsonb_typeof(v) = 'string' AND lower(v #>> '{}') = :email)
) found
GROUP BY connection_id, object_type, object_id
ORDER BY max(seen_at) DESC
LIMIT :limit
