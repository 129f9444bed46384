-- The ops function's reads: a run's charges (run detail), and the audit trail per tenant.
CREATE INDEX credit_ledger_run ON credit_ledger (run_id);
CREATE INDEX ops_audit_tenant_at ON ops_audit (tenant_id, at DESC);
