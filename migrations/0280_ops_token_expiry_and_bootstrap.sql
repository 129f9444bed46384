-- Ops tokens as something an operator manages through the API (issue 24): an optional expiry
-- (an expired token authenticates like a revoked one), who minted it, and the one-time
-- bootstrap that mints the first admin token of a deployment without a database session.
ALTER TABLE ops_tokens ADD COLUMN expires_at timestamptz;
ALTER TABLE ops_tokens ADD COLUMN created_by uuid REFERENCES ops_tokens (id);

-- At most one row, ever: the bootstrap secret is accepted while this table is empty, and the
-- INSERT that fills it is what makes exactly one bootstrap call win (the primary key on a
-- constant). It is never deleted, so a leaked bootstrap secret is worthless afterwards.
CREATE TABLE ops_bootstrap (
    singleton  boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    token_id   uuid NOT NULL REFERENCES ops_tokens (id),
    at         timestamptz NOT NULL DEFAULT now()
);
