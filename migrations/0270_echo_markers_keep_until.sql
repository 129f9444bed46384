-- Echo markers are kept until their provider can no longer deliver the echo of the write.
--
-- keep_until: expires_at plus the grace of the connection's provider (its longest redelivery
--   horizon plus onceflow's own slowest admission; shared/accounts/connections.py
--   REDELIVERY_HORIZON_SECONDS and shared/admission/echo.py expiry_grace_seconds), fixed when the marker
--   is written. The sweep deletes a marker once keep_until has passed. Until this migration
--   markers went one hour after expiry, while HubSpot retries a failed delivery for more than
--   a day: existing rows get the longest horizon any provider has (three days) plus that hour.
ALTER TABLE echo_markers ADD COLUMN keep_until timestamptz;
UPDATE echo_markers SET keep_until = expires_at + interval '73 hours';
ALTER TABLE echo_markers
    ALTER COLUMN keep_until SET NOT NULL,
    ADD CONSTRAINT echo_markers_kept_past_expiry CHECK (keep_until >= expires_at);
DROP INDEX echo_markers_expiry;
CREATE INDEX echo_markers_keep_until ON echo_markers (keep_until);
