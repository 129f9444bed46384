-- Bulk actions in the API (issue 30, item 3): a preview stores exactly the set it showed, and
-- its id is the token an act names. The act runs on these targets only (never on whatever
-- matches the filter by then), once: `acted_at`/`outcomes` are written by the first act to
-- finish, and a later act on the token answers them without acting again. `tenant_id` NULL is
-- an admin's preview; a tenant's token never finds another tenant's row (ops_bulk_get).
CREATE TABLE ops_bulk_previews (
    id          uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    tenant_id   text REFERENCES tenants (id),
    action      text NOT NULL
                CHECK (action IN ('replay', 'retry', 'cancel', 'requeue_inbox')),
    targets     text[] NOT NULL,
    reason      text,
    token_id    uuid REFERENCES ops_tokens (id),
    created_at  timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz NOT NULL,
    acted_at    timestamptz,
    outcomes    jsonb
);
