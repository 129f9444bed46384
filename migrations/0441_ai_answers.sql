-- The ai.generate journal (issue 33): a model's answer that satisfied the step's schema,
-- written (committed) as soon as it is received, before the step settles, under the step's
-- lineage key. Another attempt under the same key — the retry after a lost lease or a
-- crash between the answer and the settle, a replay that starts the step again — finds it
-- and reuses it instead of paying the model again, as long as it would send the same request
-- (request_hash: model, prompt, schema, temperature, token cap). A different request under
-- the key (an earlier step's output changed the prompt) asks again and replaces the row.
-- Deleted with the step that first wrote it (retention deletes whole lineages).
CREATE TABLE ai_answers (
    idempotency_key text PRIMARY KEY,
    tenant_id       text NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    step_id         uuid NOT NULL REFERENCES workflow_steps (id) ON DELETE CASCADE,
    request_hash    text NOT NULL CHECK (request_hash ~ '^[0-9a-f]{64}$'),
    model           text NOT NULL,
    answer          jsonb NOT NULL,
    usage           jsonb NOT NULL,
    model_version   text,
    created_at      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX ai_answers_step ON ai_answers (step_id);
