-- Approvals are decided by a tenant's people: an approval names a role, users, or both, and an
-- ops token says who its holder is (`label`, the user name) and which of the tenant's roles
-- the holder has. Existing tokens have none.
ALTER TABLE ops_tokens ADD COLUMN roles text[] NOT NULL DEFAULT '{}';
