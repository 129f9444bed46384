"""The statements of shared/sql/ops.sql, each bound once, by the name its readers import.

A name ops.sql lacks fails here, when ops is imported, not when a request first needs it; a
statement that two modules read (a run, its steps, a workflow, an event, a version's
definition) is one binding, not two that could be pointed at different blocks.
"""

from __future__ import annotations

from shared.core import queries

OPS = queries.load("ops")
ACTIVE_VERSION = OPS["ops_active_version"]
APPROVALS_OPEN = OPS["ops_approvals_open"]
AUDIT_INSERT = OPS["ops_audit_insert"]
BINDINGS_FOR_TENANT = OPS["ops_bindings_for_tenant"]
BOOTSTRAP_CLAIM = OPS["ops_bootstrap_claim"]
CONNECTION_HEALTH = OPS["ops_connection_health"]
CONNECTION_TENANT = OPS["ops_connection_tenant"]
CONNECTIONS_LIST = OPS["ops_connections_list"]
CREDIT_BALANCE = OPS["ops_credit_balance"]
CREDIT_LEDGER = OPS["ops_credit_ledger"]
EVENT_GET = OPS["ops_event_get"]
LINEAGE_OLDEST_KEYS = OPS["ops_lineage_oldest_keys"]
REPLAYS_OF = OPS["ops_lineage_replays_of"]
LINEAGE_ROOT_CREATED = OPS["ops_lineage_root_created"]
LINEAGE_RUNS = OPS["ops_lineage_runs"]
RECORD_CLAIMS = OPS["ops_record_claims"]
RECORD_EVENTS = OPS["ops_record_events"]
RECORD_REFUSALS = OPS["ops_record_refusals"]
RECORD_RUNS = OPS["ops_record_runs"]
REFUSALS_LIST = OPS["ops_refusals_list"]
REHEARSAL_PENDING = OPS["ops_rehearsal_pending"]
REHEARSAL_RESULT = OPS["ops_rehearsal_result"]
REHEARSAL_RUN_INSERT = OPS["ops_rehearsal_run_insert"]
REHEARSAL_SERVE_DELAYS = OPS["ops_rehearsal_serve_delays"]
REHEARSAL_STATUS = OPS["ops_rehearsal_status"]
REHEARSAL_STOP = OPS["ops_rehearsal_stop"]
REPLAY_FORGET_AI_ANSWERS = OPS["ops_replay_forget_ai_answers"]
REPLAY_RUN_INSERT = OPS["ops_replay_run_insert"]
REPLAY_STEP_RESTART = OPS["ops_replay_step_restart"]
REPLAY_STEPS_COPY = OPS["ops_replay_steps_copy"]
RETRY_RUN_REOPEN = OPS["ops_retry_run_reopen"]
RETRY_STEP_RESET = OPS["ops_retry_step_reset"]
RUN_CHARGES = OPS["ops_run_charges"]
RUN_GET = OPS["ops_run_get"]
RUN_LEASES = OPS["ops_run_leases"]
RUN_LOCK = OPS["ops_run_lock"]
RUN_STEPS = OPS["ops_run_steps"]
RUNS_LIST = OPS["ops_runs_list"]
SWEEP_DUTIES = OPS["ops_sweep_duties"]
TENANT_EXISTS = OPS["ops_tenant_exists"]
TENANT_INSERT = OPS["ops_tenant_insert"]
TENANTS_LIST = OPS["ops_tenants_list"]
TOKEN_FIND = OPS["ops_token_find"]
TOKEN_GET = OPS["ops_token_get"]
TOKEN_INSERT = OPS["ops_token_insert"]
TOKEN_REVOKE = OPS["ops_token_revoke"]
TOKENS_LIST = OPS["ops_tokens_list"]
VERSION_DEFINITION = OPS["ops_version_definition"]
VERSION_GET = OPS["ops_version_get"]
WORKFLOW_GET = OPS["ops_workflow_get"]
WORKFLOW_VERSIONS = OPS["ops_workflow_versions"]
WORKFLOWS_LIST = OPS["ops_workflows_list"]
