-- Credits, per-connection throttling, and ops access.

-- One row per charge. Unique on the lineage's idempotency key: a retry or replay of a step
-- already charged in its lineage can't charge again (invariant 11).
CREATE TABLE credit_ledger (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant_id        text NOT NULL REFERENCES tenants (id),
    lineage_key      text NOT NULL UNIQUE,
    amount           bigint NOT NULL,
    block_type       text NOT NULL,
    run_id           uuid REFERENCES workflow_runs (id),
    step_id          uuid REFERENCES workflow_steps (id),
    created_at       timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX credit_ledger_tenant ON credit_ledger (tenant_id, created_at DESC);

-- Fixed-window counters per connection, claimed with one INSERT … ON CONFLICT … RETURNING.
CREATE TABLE throttle_windows (
    connection_id  uuid NOT NULL REFERENCES connections (id),
    window_start   timestamptz NOT NULL,
    used           integer NOT NULL,
    PRIMARY KEY (connection_id, window_start)
);

-- Bearer tokens for the ops function, stored as SHA-256 only; tenant NULL means admin.
CREATE TABLE ops_tokens (
    id            uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    token_sha256  bytea NOT NULL UNIQUE,
    tenant_id     text REFERENCES tenants (id),
    label         text NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    revoked_at    timestamptz
);

-- Every mutating ops call: who, what, when.
CREATE TABLE ops_audit (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    token_id    uuid REFERENCES ops_tokens (id),
    tenant_id   text,
    action      text NOT NULL,
    target      text,
    detail      jsonb NOT NULL DEFAULT '{}'::jsonb,
    at          timestamptz NOT NULL DEFAULT now()
);
