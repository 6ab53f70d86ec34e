-- Read-only access for data engineers and analysts (PostgreSQL).
--
-- Run once per database as its owner after `epiflow db upgrade`, e.g.
--   psql "$DATABASE_URL" -f infra/sql/analyst_role.sql
--   psql "$DATABASE_URL" -c "CREATE ROLE alice LOGIN PASSWORD '…' IN ROLE epiflow_analyst"
-- The role can SELECT every table and view (episode_summary, tool_failure_rates,
-- quality_by_suite, training_lineage) and write nothing. Tables and views that later
-- migrations create are covered by the default privileges at the end.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'epiflow_analyst') THEN
        CREATE ROLE epiflow_analyst NOLOGIN;
    END IF;
    EXECUTE format('GRANT CONNECT ON DATABASE %I TO epiflow_analyst', current_database());
END
$$;

GRANT USAGE ON SCHEMA public TO epiflow_analyst;
GRANT SELECT ON ALL TABLES IN SCHEMA public TO epiflow_analyst;
REVOKE INSERT, UPDATE, DELETE, TRUNCATE, REFERENCES, TRIGGER ON ALL TABLES IN SCHEMA public FROM epiflow_analyst;
ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT SELECT ON TABLES TO epiflow_analyst;
