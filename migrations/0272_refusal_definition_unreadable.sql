-- A binding whose stored definition no longer parses is refused alone, with a reason
-- (issue 23, item 16), instead of failing the admission of its event for every workflow
-- bound to the type. The reasons' one list is shared/admission/admit.py `Reason`; this CHECK
-- mirrors it.
ALTER TABLE admission_refusals DROP CONSTRAINT admission_refusals_reason_check;
ALTER TABLE admission_refusals ADD CONSTRAINT admission_refusals_reason_check CHECK (reason IN (
    'duplicate', 'already_running', 'rule_not_matched', 'insufficient_credits',
    'echo_suppressed', 'provider_suppressed', 'missing_record_identity', 'workflow_paused',
    'definition_unreadable'));
