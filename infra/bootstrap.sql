-- Once per database, as the built-in `postgres` user (Cloud SQL's cloudsqlsuperuser), after
-- the first `terraform apply` created the instance, the database and the IAM database users:
--
--   psql "host=127.0.0.1 port=5432 user=postgres dbname=onceflow" -v ON_ERROR_STOP=1 \
--     -c "SET onceflow.deployer = 'onceflow-deployer@PROJECT.iam'" -f infra/bootstrap.sql
--
-- (through `cloud-sql-proxy --private-ip PROJECT:REGION:onceflow` from a machine in the VPC,
-- or Cloud SQL Studio). IAM database users get no privileges by default, and in particular
-- no CREATEROLE; this hands the deployer exactly what its two jobs need and nothing else:
--
--   * owner of the schema's contents: CREATE on schema public (PostgreSQL 15+ no longer lets
--     every user create there), so the migrations it applies create tables it owns;
--   * grantor of the app role: `onceflow_app` is created here, and the deployer gets it WITH
--     ADMIN OPTION, so infra/grants.sql (run by the pipeline as the deployer after every
--     apply) can hand it to each function's IAM user without CREATEROLE.
--
-- Idempotent: running it again changes nothing.
DO $bootstrap$
DECLARE
    deployer text := current_setting('onceflow.deployer', true);
BEGIN
    IF deployer IS NULL OR deployer = '' THEN
        RAISE EXCEPTION 'set onceflow.deployer to the deployer''s IAM database user first'
            USING HINT = 'SET onceflow.deployer = ''onceflow-deployer@PROJECT.iam''';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = deployer) THEN
        RAISE EXCEPTION 'there is no database user %', deployer
            USING HINT = 'terraform apply creates it (google_sql_user.deployer); run that first';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'onceflow_app') THEN
        CREATE ROLE onceflow_app NOLOGIN;
    END IF;
    EXECUTE format('GRANT USAGE, CREATE ON SCHEMA public TO %I', deployer);
    EXECUTE format('GRANT onceflow_app TO %I WITH ADMIN OPTION', deployer);
    GRANT USAGE ON SCHEMA public TO onceflow_app;
END
$bootstrap$;
