-- Issue 23 items 4 and 7: a charge and a budget reservation belong to one application of a
-- lineage's step, not to the lineage for good.

-- A refunded charge no longer holds its lineage: a replay that then applies is charged again
-- (a new ledger row), once. At most one live (unrefunded) charge per lineage key, so retries and
-- re-runs of one application still find it and are `already_charged` (invariant 11). The refund
-- sets `refunded_at` in the same transaction that writes its credit_refunds row.
ALTER TABLE credit_ledger ADD COLUMN refunded_at timestamptz;
UPDATE credit_ledger l SET refunded_at = r.created_at FROM credit_refunds r WHERE r.charge_id = l.id;
ALTER TABLE credit_ledger DROP CONSTRAINT credit_ledger_lineage_key_key;
CREATE UNIQUE INDEX credit_ledger_live_charge ON credit_ledger (lineage_key)
    WHERE refunded_at IS NULL;
-- The run detail lists every charge of a lineage, refunded ones included.
CREATE INDEX credit_ledger_lineage ON credit_ledger (lineage_key);

-- A reservation per step row: the attempts of one step (retries, re-runs of an attempt) share
-- it, and a replay — a new step row that really sends again — reserves against the cap afresh.
ALTER TABLE budget_reservations DROP CONSTRAINT budget_reservations_idempotency_key_key;
CREATE UNIQUE INDEX budget_reservations_application
    ON budget_reservations (idempotency_key, step_id) NULLS NOT DISTINCT;
