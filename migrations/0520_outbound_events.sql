-- Outbound events (issue 30 item 4): a tenant subscribes a URL to a few facts; each fact is
-- written as one delivery row per matching subscription IN THE TRANSACTION OF THE FACT (a
-- transactional outbox), then sent by the sweep (shared/publishing/outbound.py), signed with
-- Standard Webhooks, at least once, retried with backoff, given up after a bounded number of
-- attempts.

CREATE TABLE outbound_subscriptions (
    id           uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    tenant_id    text NOT NULL REFERENCES tenants (id),
    url          text NOT NULL CHECK (length(url) <= 2048),
    event_types  text[] NOT NULL CHECK (
                     cardinality(event_types) > 0
                     AND event_types <@ ARRAY['run.failed', 'run.succeeded', 'event.refused',
                                              'event.undelivered', 'breaker.tripped',
                                              'approval.requested']),
    -- The *name* of the variable holding the 'whsec_<base64>' secret (Secret Manager fills it
    -- in the cloud), as every other tenant secret (tenants.signing_secret_env,
    -- connections.webhook_secret_env): a database dump never holds a usable key.
    secret_env   text NOT NULL CHECK (secret_env ~ '^[A-Z][A-Z0-9_]{0,127}$'),
    enabled      boolean NOT NULL DEFAULT true,
    created_at   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX outbound_subscriptions_tenant ON outbound_subscriptions (tenant_id) WHERE enabled;

CREATE TABLE outbound_deliveries (
    -- 'msg_' + md5(subscription id ':' event key): the same fact for the same subscription is
    -- the same row whatever writes it again (a re-executed transaction, a second trigger path),
    -- and the Standard Webhooks `webhook-id` every attempt carries.
    id               text PRIMARY KEY CHECK (id ~ '^msg_[0-9a-f]{32}$'),
    subscription_id  uuid NOT NULL REFERENCES outbound_subscriptions (id) ON DELETE CASCADE,
    tenant_id        text NOT NULL REFERENCES tenants (id),
    event_type       text NOT NULL,
    event_key        text NOT NULL,
    data             jsonb NOT NULL,
    status           text NOT NULL DEFAULT 'pending'
                     CHECK (status IN ('pending', 'delivered', 'given_up')),
    -- Attempts claimed so far (counted at the claim: a sender that dies mid-attempt still used
    -- one); the give-up counts from `retry_from`, which a re-send moves up.
    attempts         integer NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    retry_from       integer NOT NULL DEFAULT 0 CHECK (retry_from >= 0),
    next_attempt_at  timestamptz NOT NULL DEFAULT now(),
    lease_id         uuid,
    lease_expires_at timestamptz,
    last_status      integer,
    last_error       text,
    last_attempt_at  timestamptz,
    delivered_at     timestamptz,
    given_up_at      timestamptz,
    created_at       timestamptz NOT NULL DEFAULT now(),
    CHECK ((status = 'delivered') = (delivered_at IS NOT NULL)),
    CHECK ((status = 'given_up') = (given_up_at IS NOT NULL))
);
CREATE INDEX outbound_deliveries_due ON outbound_deliveries (next_attempt_at)
    WHERE status = 'pending';
CREATE INDEX outbound_deliveries_tenant ON outbound_deliveries (tenant_id, created_at DESC);

-- The one emit: a row per enabled subscription of the tenant that listens to the type. Called
-- by shared/ingest/outbound.py `emit` (the Python callers: approvals) and by the triggers
-- below (the facts written by single statements: a run's end in the one-statement settle, a
-- refusal in admission's statement, a give-up in the outbox sweep, a breaker trip), so the
-- fact and its event commit or roll back together. ON CONFLICT: a re-executed transaction
-- writes nothing new.
CREATE FUNCTION outbound_emit(p_tenant text, p_type text, p_key text, p_data jsonb)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    written integer;
BEGIN
    INSERT INTO outbound_deliveries (id, subscription_id, tenant_id, event_type, event_key, data)
    SELECT 'msg_' || md5(s.id::text || ':' || p_key), s.id, s.tenant_id, p_type, p_key, p_data
      FROM outbound_subscriptions s
     WHERE s.tenant_id = p_tenant AND s.enabled AND p_type = ANY (s.event_types)
    ON CONFLICT (id) DO NOTHING;
    GET DIAGNOSTICS written = ROW_COUNT;
    RETURN written;
END $$;

-- run.failed / run.succeeded: the statement that ends a live run (steps_settle folded, the
-- transaction's runs_fail / runs_finish_if_done, the sweep's reclaim) fires this once per
-- ended run; a rehearsal never announces anything.
CREATE FUNCTION outbound_on_run_end() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM outbound_emit(
        NEW.tenant_id, 'run.' || NEW.status, 'run.' || NEW.status || ':' || NEW.id::text,
        jsonb_build_object('run_id', NEW.id, 'workflow_id', NEW.workflow_id,
                           'version_id', NEW.version_id, 'status', NEW.status,
                           'record_key', NEW.record_key, 'error', NEW.error,
                           'finished_at', NEW.finished_at));
    RETURN NULL;
END $$;
CREATE TRIGGER workflow_runs_outbound AFTER UPDATE OF status ON workflow_runs
    FOR EACH ROW
    WHEN (OLD.status = 'running' AND NEW.status IN ('failed', 'succeeded')
          AND NEW.namespace = 'live')
    EXECUTE FUNCTION outbound_on_run_end();

-- event.refused: admission writes every refusal in its one statement.
CREATE FUNCTION outbound_on_refusal() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM outbound_emit(
        NEW.tenant_id, 'event.refused',
        'event.refused:' || NEW.event_id::text || ':' || NEW.workflow_id::text,
        jsonb_build_object('event_id', NEW.event_id, 'workflow_id', NEW.workflow_id,
                           'version_id', NEW.version_id, 'record_key', NEW.record_key,
                           'reason', NEW.reason, 'detail', NEW.detail));
    RETURN NULL;
END $$;
CREATE TRIGGER admission_refusals_outbound AFTER INSERT ON admission_refusals
    FOR EACH ROW EXECUTE FUNCTION outbound_on_refusal();

-- event.undelivered: the outbox sweep gave the event up (a later give-up after an ops
-- re-queue is a second fact: keyed by the give-up's time).
CREATE FUNCTION outbound_on_undelivered() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM outbound_emit(
        NEW.tenant_id, 'event.undelivered',
        'event.undelivered:' || NEW.id::text || ':' || NEW.undelivered_at::text,
        jsonb_build_object('event_id', NEW.id, 'event_type', NEW.event_type,
                           'reason', NEW.undelivered_reason,
                           'undelivered_at', NEW.undelivered_at));
    RETURN NULL;
END $$;
CREATE TRIGGER workflow_trigger_events_outbound AFTER UPDATE OF undelivered_at
    ON workflow_trigger_events
    FOR EACH ROW WHEN (OLD.undelivered_at IS NULL AND NEW.undelivered_at IS NOT NULL)
    EXECUTE FUNCTION outbound_on_undelivered();

-- breaker.tripped: the guarded breaker_trip UPDATE (one racer wins it); keyed by the trip count.
CREATE FUNCTION outbound_on_breaker_trip() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM outbound_emit(
        w.tenant_id, 'breaker.tripped',
        'breaker.tripped:' || NEW.workflow_id::text || ':' || NEW.trips::text,
        jsonb_build_object('workflow_id', NEW.workflow_id, 'reason', NEW.reason,
                           'consecutive_failures', NEW.consecutive_failures,
                           'opened_at', NEW.opened_at))
      FROM workflows w WHERE w.id = NEW.workflow_id;
    RETURN NULL;
END $$;
CREATE TRIGGER workflow_breakers_outbound AFTER UPDATE OF state ON workflow_breakers
    FOR EACH ROW WHEN (OLD.state <> 'open' AND NEW.state = 'open')
    EXECUTE FUNCTION outbound_on_breaker_trip();

-- Retention reads finished deliveries by when they finished (outbound_deliveries_expire).
CREATE INDEX outbound_deliveries_finished
    ON outbound_deliveries (coalesce(delivered_at, given_up_at)) WHERE status <> 'pending';
