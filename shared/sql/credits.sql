-- Credits: a ledger row per charge, at most one live (unrefunded) charge per lineage key
-- (invariant 11), and a balance that one conditional UPDATE keeps from going negative under
-- concurrency.

-- name: credits_charge
-- The charge in one statement (one round trip, issue 27): the ledger row, and the debit only
-- when that row is new. A concurrent insert of the same lineage key waits for the first to
-- commit, then does nothing: the second caller learns "already charged" (no `charged_id`) and
-- never debits. Unique only among live charges (credit_ledger_live_charge): a refunded charge no
-- longer holds the lineage, so the replay that applies after a refund pays again, once. The
-- debit re-checks the balance under the tenant row's lock, so concurrent charges never take it
-- below zero. `charged_id` without `balance`: the row is new but the balance can't pay it — the
-- caller deletes that row again in the same transaction (`credits_uncharge`).
WITH ledger AS (
    INSERT INTO credit_ledger (tenant_id, lineage_key, amount, block_type, run_id, step_id)
    VALUES (:tenant_id, :lineage_key, :amount, :block_type,
            CAST(:run_id AS uuid), CAST(:step_id AS uuid))
    ON CONFLICT (lineage_key) WHERE refunded_at IS NULL DO NOTHING
    RETURNING id
), debit AS (
    UPDATE tenants SET credit_balance = credit_balance - :amount
     WHERE id = :tenant_id AND credit_balance >= :amount AND EXISTS (SELECT 1 FROM ledger)
    RETURNING credit_balance
)
SELECT (SELECT id FROM ledger) AS charged_id, (SELECT credit_balance FROM debit) AS balance

-- name: credits_uncharge
-- The ledger row this transaction wrote a moment ago for a charge the balance can't pay. No
-- other transaction can see it yet (one charging the same key waits on it, and after this
-- commits inserts its own), so deleting it is the same as never having written it.
DELETE FROM credit_ledger WHERE id = :id

-- name: credits_balance
SELECT credit_balance FROM tenants WHERE id = :tenant_id

-- name: credits_grant
UPDATE tenants SET credit_balance = credit_balance + :amount WHERE id = :tenant_id
RETURNING credit_balance

-- name: credits_mark_outcome_unknown
-- An attempt of this charge's step may have applied: the charge is no longer refundable.
UPDATE credit_ledger SET outcome_unknown_at = now()
 WHERE lineage_key = :lineage_key AND refunded_at IS NULL AND outcome_unknown_at IS NULL

-- name: credits_refund_insert
-- Refund the lineage's live charge, once: the guarded UPDATE takes the row lock, so of racing
-- settles, redeliveries or replays exactly one finds `refunded_at IS NULL` and moves it; the
-- others (after the wait, re-checking) update nothing and insert nothing — zero rows means
-- nothing to pay back. The refund row (UNIQUE charge_id) is written in the same statement.
-- Only a charge this very step row made (`step_id`): a replay's step that found an earlier
-- application's charge never pays that one back. Never a charge whose outcome was ever unknown,
-- nor one whose charging attempt lost its lease to the sweep (its process died or stalled after
-- the charge: its request may have left).
WITH refunded AS (
    UPDATE credit_ledger c SET refunded_at = now()
     WHERE c.lineage_key = :lineage_key AND c.refunded_at IS NULL AND c.amount > 0
       AND c.outcome_unknown_at IS NULL
       AND c.step_id IS NOT DISTINCT FROM CAST(:step_id AS uuid)
       AND NOT EXISTS (SELECT 1 FROM workflow_step_leases l
                        WHERE l.step_id = c.step_id AND l.end_kind = 'reclaimed'
                          AND l.claimed_at <= c.created_at AND l.ended_at >= c.created_at)
    RETURNING c.id, c.tenant_id, c.amount
)
INSERT INTO credit_refunds (charge_id, tenant_id, amount, reason, step_id)
SELECT id, tenant_id, amount, :reason, CAST(:step_id AS uuid)
  FROM refunded
ON CONFLICT (charge_id) DO NOTHING
RETURNING tenant_id, amount

-- name: credits_settle_used
-- A token price settled at what the call used: the live charge this step row made, taken at
-- the cap before the call, comes down to `amount` and the difference goes back to the balance,
-- in one statement. Only ever down (`amount > :amount`): of racing settles the first takes the
-- row lock and lowers it; the other, re-checking after the wait, finds it no longer above and
-- changes nothing (zero rows: settled already, refunded, or another step row's charge).
WITH settled AS (
    SELECT id, tenant_id, amount - CAST(:amount AS bigint) AS returned
      FROM credit_ledger
     WHERE lineage_key = :lineage_key AND refunded_at IS NULL
       AND step_id IS NOT DISTINCT FROM CAST(:step_id AS uuid)
       AND amount > CAST(:amount AS bigint)
       FOR UPDATE
), lowered AS (
    UPDATE credit_ledger c SET amount = CAST(:amount AS bigint)
      FROM settled s WHERE c.id = s.id
    RETURNING s.tenant_id, s.returned
)
UPDATE tenants t SET credit_balance = t.credit_balance + l.returned
  FROM lowered l WHERE t.id = l.tenant_id
RETURNING l.returned
