-- Table privileges for the functions' IAM database users. Cloud Build runs this as the
-- deployer after each `terraform apply`, when every function's IAM user exists. Idempotent.
--
-- Runs WITHOUT CREATEROLE (IAM database users have none): the role `onceflow_app` and the
-- deployer's ADMIN OPTION on it come from infra/bootstrap.sql, run once by `postgres`. The
-- deployer applied the migrations, so it owns every table and can grant on them.
--
-- Migrations stay free of deployment names: this file grants one NOLOGIN role the DML every
-- function needs, and hands that role to each IAM user whose name starts with
-- `onceflow-fn-` (the account ids iam.tf creates).
DO $grants$
DECLARE
    member text;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'onceflow_app') THEN
        RAISE EXCEPTION '% cannot grant onceflow_app: the role does not exist', current_user
            USING HINT = 'run infra/bootstrap.sql once as postgres (infra/README.md)';
    END IF;
    IF NOT pg_has_role(current_user, 'onceflow_app', 'MEMBER WITH ADMIN OPTION') THEN
        RAISE EXCEPTION '% cannot grant onceflow_app: no ADMIN OPTION on it', current_user
            USING HINT = 'run infra/bootstrap.sql once as postgres (infra/README.md)';
    END IF;
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
