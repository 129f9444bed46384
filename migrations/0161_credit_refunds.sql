-- Refunds: a charge whose request provably never applied is paid back, once. The refund row is
-- keyed to its charge (UNIQUE charge_id), so a replayed or redelivered settle finds it and pays
-- nothing more.
CREATE TABLE credit_refunds (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    charge_id   bigint NOT NULL UNIQUE REFERENCES credit_ledger (id),
    tenant_id   text NOT NULL REFERENCES tenants (id),
    amount      bigint NOT NULL CHECK (amount > 0),
    reason      text NOT NULL,
    step_id     uuid REFERENCES workflow_steps (id),
    created_at  timestamptz NOT NULL DEFAULT now()
);

-- Set when an attempt of the charged step ended with its request's fate unknown (a timeout, a
-- reset after sending): such a charge is never refunded, whatever a later attempt proves.
ALTER TABLE credit_ledger ADD COLUMN outcome_unknown_at timestamptz;
