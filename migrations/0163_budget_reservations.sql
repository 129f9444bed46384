-- Spend budgets: a reservation is written before a step's side effect leaves, keyed by the
-- step's idempotency key (one row per step lineage: a re-run of the same attempt finds it and
-- never counts twice), and checked under a per-budget advisory lock against the cap:
-- live reservations + settled spend in the window + amount <= cap (invariant 16). Settled by
-- outcome: spent, released (provably not applied), or left reserved (fate unknown) until the
-- reconcile duty decides.
CREATE TABLE budget_reservations (
    id                  bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    budget_key          text NOT NULL,              -- "workflow:<id>"
    idempotency_key     text NOT NULL UNIQUE,
    tenant_id           text NOT NULL REFERENCES tenants (id),
    run_id              uuid REFERENCES workflow_runs (id),
    step_id             uuid REFERENCES workflow_steps (id),
    amount              bigint NOT NULL CHECK (amount > 0),
    status              text NOT NULL CHECK (status IN ('reserved', 'spent', 'released')),
    reserved_at         timestamptz NOT NULL DEFAULT now(),
    settled_at          timestamptz,
    settled_by          text CHECK (settled_by IN ('outcome', 'reconcile')),
    -- An attempt ended with its request's fate unknown: never released, only spent.
    outcome_unknown_at  timestamptz,
    CONSTRAINT budget_reservations_settled
        CHECK ((status = 'reserved') = (settled_at IS NULL AND settled_by IS NULL))
);
-- What the cap check sums: the budget's live and spent rows of the window.
CREATE INDEX budget_reservations_counted
    ON budget_reservations (budget_key, reserved_at) WHERE status <> 'released';
-- What the reconcile duty scans.
CREATE INDEX budget_reservations_open ON budget_reservations (reserved_at)
    WHERE status = 'reserved';
