-- Credits: a ledger row per charge, unique on the lineage key (invariant 11), and a balance
-- that one conditional UPDATE keeps from going negative under concurrency.

-- name: credits_savepoint
SAVEPOINT onceflow_charge

-- name: credits_rollback_savepoint
ROLLBACK TO SAVEPOINT onceflow_charge

-- name: credits_release_savepoint
RELEASE SAVEPOINT onceflow_charge

-- name: credits_ledger_insert
-- A concurrent insert of the same lineage key waits for the first to commit, then does nothing:
-- the second caller learns "already charged" and never reaches the debit.
INSERT INTO credit_ledger (tenant_id, lineage_key, amount, block_type, run_id, step_id)
VALUES (:tenant_id, :lineage_key, :amount, :block_type,
        CAST(:run_id AS uuid), CAST(:step_id AS uuid))
ON CONFLICT (lineage_key) DO NOTHING
RETURNING id

-- name: credits_debit
-- The row lock serializes concurrent debits; each re-checks the balance it sees after the wait.
UPDATE tenants SET credit_balance = credit_balance - :amount
 WHERE id = :tenant_id AND credit_balance >= :amount
RETURNING credit_balance

-- name: credits_balance
SELECT credit_balance FROM tenants WHERE id = :tenant_id

-- name: credits_grant
UPDATE tenants SET credit_balance = credit_balance + :amount WHERE id = :tenant_id
RETURNING credit_balance

-- name: credits_mark_outcome_unknown
-- An attempt of this charge's step may have applied: the charge is no longer refundable.
UPDATE credit_ledger SET outcome_unknown_at = now()
 WHERE lineage_key = :lineage_key AND outcome_unknown_at IS NULL

-- name: credits_refund_insert
-- At most one refund per charge (UNIQUE charge_id): a second settle, a redelivery or a replay
-- inserts nothing and so credits nothing. A charge whose outcome was ever unknown is not
-- refunded.
INSERT INTO credit_refunds (charge_id, tenant_id, amount, reason, step_id)
SELECT id, tenant_id, amount, :reason, CAST(:step_id AS uuid)
  FROM credit_ledger
 WHERE lineage_key = :lineage_key AND amount > 0 AND outcome_unknown_at IS NULL
ON CONFLICT (charge_id) DO NOTHING
RETURNING tenant_id, amount
