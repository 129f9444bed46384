-- Echo markers match only changes that happened after onceflow's write was sent.
--
-- sent_at: when the write was about to leave (crm.update: the marker's commit just before the
--   request; crm.create: the step's at-most-once mark, set just before the request). A change
--   that occurred earlier than that (minus a small clock skew between the provider and the
--   database) is a person's change, never the echo of ours, even when it set the same value.
ALTER TABLE echo_markers ADD COLUMN sent_at timestamptz;
UPDATE echo_markers SET sent_at = created_at;
ALTER TABLE echo_markers
    ALTER COLUMN sent_at SET NOT NULL,
    ALTER COLUMN sent_at SET DEFAULT now();

-- The one definition of "markers that can explain this change", used by admission's context
-- statement and by shared/admission/echo.py alike. A single-SELECT SQL function: Postgres inlines it
-- into the calling statement, so the lookup index is still used.
CREATE FUNCTION echo_markers_alive(
    p_connection_id uuid, p_object_type text, p_object_id text, p_fields text[],
    p_occurred_at timestamptz, p_skew_seconds double precision)
RETURNS TABLE (field text, value_hash bytea)
LANGUAGE sql STABLE AS $$
    SELECT m.field, m.value_hash
    FROM echo_markers m
    WHERE m.connection_id = p_connection_id AND m.object_type = p_object_type
      AND m.object_id = p_object_id AND m.field = ANY(p_fields)
      AND m.expires_at > p_occurred_at
      AND m.sent_at <= p_occurred_at + make_interval(secs => p_skew_seconds)
$$;
