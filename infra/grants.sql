-- Table privileges for the functions' IAM database users. Cloud Build runs this as the
-- deployer (the owner of every table, since it applies the migrations) after each
-- `terraform apply`, when every function's IAM user exists. Idempotent.
--
-- Migrations stay free of deployment names: this file grants one NOLOGIN role the DML every
-- function needs, and hands that role to each IAM user whose name starts with
-- `onceflow-fn-` (the account ids iam.tf creates).
DO $grants$
DECLARE
    member text;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'onceflow_app') THEN
        CREATE ROLE onceflow_app NOLOGIN;
    END IF;
    GRANT USAGE ON SCHEMA public TO onceflow_app;
    GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO onceflow_app;
    GRANT USAGE, SELECT, UPDATE ON ALL SEQUENCES IN SCHEMA public TO onceflow_app;
    GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA public TO onceflow_app;
    -- Tables a later migration creates are covered before the next run of this file.
    ALTER DEFAULT PRIVILEGES IN SCHEMA public
        GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO onceflow_app;
    ALTER DEFAULT PRIVILEGES IN SCHEMA public
        GRANT USAGE, SELECT, UPDATE ON SEQUENCES TO onceflow_app;
    FOR member IN
        SELECT rolname FROM pg_roles
        WHERE starts_with(rolname, 'onceflow-fn-') AND rolcanlogin
    LOOP
        EXECUTE 'GRANT onceflow_app TO ' || quote_ident(member);
    END LOOP;
END
$grants$;
