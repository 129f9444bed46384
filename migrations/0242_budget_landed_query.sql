-- Issue 23 item 16: how the reconcile duty may ask the provider whether an ambiguous attempt
-- landed (a create stamped with a unique key property: {connection_id, object_type, property,
-- value}); NULL when it can't be asked (the reservation is then counted spent, as before).
ALTER TABLE budget_reservations ADD COLUMN landed_query jsonb;
