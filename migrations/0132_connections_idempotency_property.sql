-- Ambiguous creates resolved when the portal allows it (issue 13, item 6). When the portal has
-- a unique-value property (HubSpot `hasUniqueValue`) reserved for onceflow's key, crm.create
-- stamps the step's idempotency key in it; a create whose first response was lost can then be
-- sent again, and HubSpot's 409 "Existing ID: N" names the record the first one made. Null:
-- no such property, and a create stays at-most-once (OUTCOME_UNKNOWN after an ambiguous try).
ALTER TABLE connections ADD COLUMN idempotency_property text
    CHECK (idempotency_property IS NULL OR idempotency_property ~ '^[a-z][a-z0-9_]{0,99}$');
