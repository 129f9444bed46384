-- An install is bound to the person who started it (issue 23, item 11: OAuth CSRF).
--
-- The state proves an install was started; it does not prove that the browser HubSpot sends
-- back belongs to whoever started it: an install link started by tenant A's operator and
-- opened by another company's HubSpot admin would connect that company's portal to tenant A.
-- So the callback (public, on the webhook function) no longer connects anything: it exchanges
-- the code, learns the portal, keeps the grant sealed here and shows a page naming tenant and
-- portal with a confirmation code that only that browser sees. The connection is made when
-- the ops token that started the install confirms with that code (ops, authenticated):
-- both the browser that consented and the operator who started must be the same person.
--
-- portal_id, grant_sealed (the grant sealed with the token KEK named by grant_kek_env, bound
-- to the state), confirm_code_sha256 (only the hash), confirm_by (the confirmation's
-- deadline): set together by the callback; confirmed_at by the one confirmation; the sealed
-- grant is cleared then (the connection holds it).
ALTER TABLE oauth_install_states
    ADD COLUMN portal_id           text,
    ADD COLUMN grant_sealed        bytea,
    ADD COLUMN grant_kek_env       text,
    ADD COLUMN confirm_code_sha256 bytea UNIQUE,
    ADD COLUMN confirm_by          timestamptz,
    ADD COLUMN confirmed_at        timestamptz,
    ADD CONSTRAINT oauth_install_states_pending_whole CHECK (
        (confirm_code_sha256 IS NULL) = (confirm_by IS NULL)
        AND (confirm_code_sha256 IS NULL) = (portal_id IS NULL)
        AND (grant_sealed IS NULL) = (grant_kek_env IS NULL)
        AND (grant_sealed IS NULL OR confirm_code_sha256 IS NOT NULL)),
    ADD CONSTRAINT oauth_install_states_confirmed_after_use CHECK (
        confirmed_at IS NULL
        OR (used_at IS NOT NULL AND confirm_code_sha256 IS NOT NULL AND grant_sealed IS NULL));
