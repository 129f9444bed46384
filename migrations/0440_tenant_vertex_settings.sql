-- Per-tenant Vertex AI settings for the `ai.generate` block (issue 33): which Google Cloud
-- project and location its Gemini calls go to, and the model used when a step names none.
-- They live on the tenant, next to its other outbound settings (signing_secret_env), not on a
-- connection: there is no account to install and no secret to keep — the call is made as the
-- function's own service account (ADC), so a "vertex connection" would hold nothing but
-- these three names. NULL: the deployment's project (GOOGLE_CLOUD_PROJECT), the `global`
-- location, and the block's default model.
ALTER TABLE tenants
    ADD COLUMN vertex_project text CHECK (vertex_project ~ '^[a-z][a-z0-9-]{4,28}[a-z0-9]$'),
    ADD COLUMN vertex_location text CHECK (vertex_location ~ '^[a-z0-9-]{2,40}$'),
    ADD COLUMN vertex_model text CHECK (vertex_model ~ '^[A-Za-z0-9._-]{1,100}$');
