-- Per-tenant SMTP settings for approval emails (issue 31, item 4): where the sweep sends the
-- signed links of approvals with `channels.email`. Next to the tenant's other outbound
-- settings; the password is a secret reference (the variable's name, Secret Manager in the
-- cloud), never the value. NULL smtp_host: the tenant sends no email.
ALTER TABLE tenants
    ADD COLUMN smtp_host text CHECK (smtp_host ~ '^[A-Za-z0-9.-]{1,253}$'),
    ADD COLUMN smtp_port integer CHECK (smtp_port BETWEEN 1 AND 65535),
    ADD COLUMN smtp_from text CHECK (length(smtp_from) BETWEEN 3 AND 320),
    ADD COLUMN smtp_username text,
    ADD COLUMN smtp_password_env text CHECK (smtp_password_env ~ '^[A-Z][A-Z0-9_]{0,99}$'),
    ADD COLUMN smtp_starttls boolean NOT NULL DEFAULT true,
    ADD CONSTRAINT tenants_smtp_complete CHECK (smtp_host IS NULL OR smtp_from IS NOT NULL);
