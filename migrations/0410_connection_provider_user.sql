-- The provider user a connection's writes act as (issue 28 item 3).
--
-- Pipedrive stamps every webhook with the user who made the change (`meta.user_id`) and how
-- (`meta.change_source`: `api` through the API, `app` in the web app; webhooks v2 guide,
-- https://pipedrive.readme.io/docs/guide-for-webhooks-v2). An OAuth token or API token acts as
-- one user (found with GET /v1/users/me at install), so onceflow's own writes come back as
-- (`api`, that user). Admission uses it to tell a change nobody at onceflow could have made
-- from a possible echo (shared/ingest/echo.py `authored_elsewhere`); NULL: not known, and the
-- echo-marker rule decides alone.
ALTER TABLE connections ADD COLUMN provider_user_id text
    CHECK (length(provider_user_id) BETWEEN 1 AND 200);
