-- Issue 23 item 16: a half-open breaker admits a bounded number of trial runs
-- (shared/gates/breaker.py HALF_OPEN_PROBES), not every event. The count of trials admitted since the
-- breaker was last resumed; admission claims one per trial run with a guarded UPDATE.
ALTER TABLE workflow_breakers
    ADD COLUMN probes_admitted integer NOT NULL DEFAULT 0 CHECK (probes_admitted >= 0);
