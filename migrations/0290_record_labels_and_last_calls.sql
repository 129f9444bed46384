-- What people call a record, and whether a connection's provider answers (issue 24).
--
-- record_labels: the name and email of a record as onceflow's own CRM reads and writes saw
-- them (shared/port/record_labels.py). HubSpot's webhooks carry only the property that changed, so
-- without this the page could show nothing but `<connection>:<type>:<id>`, and a search by
-- email found a record only when its email was the changed property. One row per record,
-- written only when the label or email changed.
CREATE TABLE record_labels (
    record_key    text PRIMARY KEY,  -- <connection id>:<object type>:<object id>
    connection_id uuid NOT NULL REFERENCES connections (id),
    label         text CHECK (length(label) <= 300),
    email         text CHECK (email = lower(email) AND length(email) <= 320),
    updated_at    timestamptz NOT NULL DEFAULT now(),
    CHECK (label IS NOT NULL OR email IS NOT NULL)
);
-- "Who is ada@example.com?" within the caller's connections.
CREATE INDEX record_labels_email ON record_labels (connection_id, email) WHERE email IS NOT NULL;

-- The connection's last real call to its provider (shared/port/observed.py): noted at most
-- once a minute per instance, at once when it turns from working to failing or back.
ALTER TABLE connections
    ADD COLUMN last_call_at    timestamptz,
    ADD COLUMN last_call_ok    boolean,
    ADD COLUMN last_call_error text,
    ADD CONSTRAINT connections_last_call_complete
        CHECK ((last_call_at IS NULL) = (last_call_ok IS NULL));

-- How a label reads, in one place for every statement that shows one:
-- "Ada Lovelace <ada@example.com>", or the name or the email alone.
CREATE FUNCTION record_label(label text, email text) RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    RETURN CASE WHEN label IS NOT NULL AND email IS NOT NULL THEN label || ' <' || email || '>'
                ELSE coalesce(label, email) END;
