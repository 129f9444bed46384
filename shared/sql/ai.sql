-- The ai.generate block: a tenant's Vertex AI settings (migration 0440).

-- name: tenant_vertex_settings
SELECT vertex_project, vertex_location, vertex_model FROM tenants WHERE id = :tenant_id
