-- The ai.generate block: a tenant's Vertex AI settings (migration 0440).

-- name: tenant_vertex_settings
SELECT vertex_project, vertex_location, vertex_model FROM tenants WHERE id = :tenant_id

-- name: ai_answer_get
-- The answer journaled under this lineage key for this exact request; none: ask the model.
SELECT model, answer, usage, model_version, created_at FROM ai_answers
WHERE idempotency_key = :idempotency_key AND request_hash = :request_hash
  AND tenant_id = :tenant_id

-- name: ai_answer_put
-- Journal a conforming answer under the lineage key. Two attempts of one key never run at
-- once (the step's lease), so the conflict is an earlier attempt's or a replay's row: the
-- newest request's answer replaces it (a reuse reads it only when its request_hash matches).
INSERT INTO ai_answers
    (idempotency_key, tenant_id, step_id, request_hash, model, answer, usage, model_version)
VALUES (:idempotency_key, :tenant_id, CAST(:step_id AS uuid), :request_hash, :model,
        CAST(:answer AS jsonb), CAST(:usage AS jsonb), :model_version)
ON CONFLICT (idempotency_key) DO UPDATE SET
    request_hash = EXCLUDED.request_hash, model = EXCLUDED.model, answer = EXCLUDED.answer,
    usage = EXCLUDED.usage, model_version = EXCLUDED.model_version, created_at = now()
