-- A portal's shared rate budget (issue 29, item 5): what the vendor's rate-limit headers last
-- said the portal has left, per connection, so every workflow and every instance on the
-- connection counts against the same figure (shared/port/budget.py, shared/sql/
-- connection_budget.sql). One row per connection that has made a call; the connection-limit
-- gate takes from it before it claims a slot in the connection's configured window.
--
-- `remaining` until `remaining_until`: the vendor's short window (HubSpot's ten-secondly,
-- Pipedrive's two-second burst); `daily_remaining` until `daily_until`: its daily budget.
-- `shrunk_max` until `shrunk_until`: a 429 halved the connection's window; a quiet period
-- without another (each 429 pushes `shrunk_until` on) restores the configured window.
CREATE TABLE connection_rate_budgets (
    connection_id   uuid PRIMARY KEY REFERENCES connections (id) ON DELETE CASCADE,
    remaining       integer,
    remaining_until timestamptz,
    daily_remaining integer,
    daily_until     timestamptz,
    shrunk_max      integer,
    shrunk_until    timestamptz,
    observed_at     timestamptz NOT NULL DEFAULT now()
);
