-- Read-only access for data engineers and analysts (PostgreSQL), run with psql.
--
--   psql -X "$DATABASE_URL" -f infra/sql/analyst_role.sql
--   psql -X "$DATABASE_URL" -c "CREATE ROLE alice LOGIN PASSWORD '…' IN ROLE epiflow_analyst"
--
-- Run it as the database's owner (a superuser is not needed) after `epiflow db upgrade`,
-- once per database; running it again changes nothing. It stops at the first problem
-- with a non-zero exit code and one line saying which privilege it needs, before it has
-- changed anything (everything happens in one transaction).
--
-- What the role can do: connect, and SELECT every table and view (episode_summary,
-- tool_failure_rates, quality_by_suite, quality_by_template, training_lineage,
-- reproducibility_by_suite), including those later migrations create as the database
-- owner (default privileges). What it cannot do: write anything. It gets no write
-- privilege on any table, and the script takes from PUBLIC (every role in this database
-- but the owner) what PostgreSQL grants by default:
--   * TEMPORARY on the database (temporary tables, views, sequences and pg_temp functions);
--     roles other than the owner that need temporary tables must be granted it by name;
--   * CREATE on the database (schemas, trusted extensions) and on schema public (tables,
--     views, functions, types);
--   * EXECUTE on the functions that create large objects (lo_create, lo_creat,
--     lo_from_bytea, lo_import): PostgreSQL has no privilege for creating large objects, so
--     this is the only way to stop one, and only a superuser may change pg_catalog
--     functions. A non-superuser owner therefore needs a superuser to run
--     infra/sql/analyst_large_objects.sql once for the database first (this script says
--     so and stops); `-v large_objects=allowed` accepts knowingly that analysts can create
--     large objects (e.g. on a managed service without a superuser).
--
-- Options (psql variables): -v analyst_role=NAME (default epiflow_analyst),
-- -v large_objects=allowed (see above).
\set ON_ERROR_STOP on
\set QUIET on
\set VERBOSITY terse
\if :{?analyst_role}
\else
\set analyst_role epiflow_analyst
\endif
\if :{?large_objects}
\else
\set large_objects refuse
\endif

BEGIN;
SELECT set_config('epiflow.analyst_role', :'analyst_role', true) AS _role,
       set_config('epiflow.large_objects', :'large_objects', true) AS _large_objects \gset

-- 1. Everything this script needs, checked before it changes anything.
DO $check$
DECLARE
    analyst text := current_setting('epiflow.analyst_role');
    large_objects text := current_setting('epiflow.large_objects');
    superuser boolean;
    create_role boolean;
    owner_role oid;
BEGIN
    SELECT r.rolsuper, r.rolcreaterole INTO superuser, create_role
    FROM pg_roles r WHERE r.rolname = current_user;
    SELECT d.datdba INTO owner_role FROM pg_database d WHERE d.datname = current_database();
    IF NOT superuser AND NOT pg_has_role(current_user, owner_role, 'MEMBER') THEN
        RAISE EXCEPTION 'analyst_role.sql needs the owner of database % (or a superuser); % is neither: run it as %',
            current_database(), current_user, pg_get_userbyid(owner_role);
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = analyst)
       AND NOT (superuser OR create_role) THEN
        RAISE EXCEPTION 'creating role % needs the CREATEROLE privilege, which % lacks: ask an administrator to run `ALTER ROLE % CREATEROLE` (or `CREATE ROLE % NOLOGIN`), then run this script again',
            analyst, current_user, current_user, analyst;
    END IF;
    IF has_schema_privilege('public', 'public', 'CREATE') AND NOT superuser
       AND NOT pg_has_role(current_user,
                           (SELECT nspowner FROM pg_namespace WHERE nspname = 'public'),
                           'MEMBER') THEN
        RAISE EXCEPTION 'every role may create objects in schema public, and taking that back needs the owner of schema public (%) or a superuser: ask one to run `REVOKE CREATE ON SCHEMA public FROM PUBLIC`, then run this script again',
            pg_get_userbyid((SELECT nspowner FROM pg_namespace WHERE nspname = 'public'));
    END IF;
    IF large_objects <> 'allowed' AND NOT superuser
       AND has_function_privilege('public', 'pg_catalog.lo_create(oid)', 'EXECUTE') THEN
        RAISE EXCEPTION 'any role can still create large objects in database % (lo_create is executable by PUBLIC), and only a superuser can take that back: ask one to run infra/sql/analyst_large_objects.sql on this database once, then run this script again (or pass -v large_objects=allowed to accept it)',
            current_database();
    END IF;
END
$check$;

-- 2. The role.
SELECT format('CREATE ROLE %I NOLOGIN', :'analyst_role')
WHERE NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = :'analyst_role') \gexec

-- 3. What every role but the owner gets by default in this database, taken back.
SELECT format('REVOKE TEMPORARY, CREATE ON DATABASE %I FROM PUBLIC', current_database()) \gexec
SELECT 'REVOKE CREATE ON SCHEMA public FROM PUBLIC'
WHERE has_schema_privilege('public', 'public', 'CREATE') \gexec
-- As a superuser, large objects too (what analyst_large_objects.sql does).
SELECT stmt FROM pg_roles r, pg_database d, LATERAL (VALUES
    ('REVOKE EXECUTE ON FUNCTION pg_catalog.lo_create(oid), pg_catalog.lo_creat(integer), '
     'pg_catalog.lo_from_bytea(oid, bytea), pg_catalog.lo_import(text), '
     'pg_catalog.lo_import(text, oid) FROM PUBLIC', 1),
    (format('GRANT EXECUTE ON FUNCTION pg_catalog.lo_create(oid), pg_catalog.lo_creat(integer), '
            'pg_catalog.lo_from_bytea(oid, bytea) TO %I', pg_get_userbyid(d.datdba)), 2)
) AS s (stmt, n)
WHERE r.rolname = current_user AND r.rolsuper AND d.datname = current_database()
  AND :'large_objects' <> 'allowed'
  AND has_function_privilege('public', 'pg_catalog.lo_create(oid)', 'EXECUTE')
ORDER BY n \gexec

-- 4. Read access, and nothing else.
SELECT format('GRANT CONNECT ON DATABASE %I TO %I', current_database(), :'analyst_role') \gexec
SELECT format('REVOKE TEMPORARY, CREATE ON DATABASE %I FROM %I', current_database(), :'analyst_role') \gexec
SELECT format('GRANT USAGE ON SCHEMA public TO %I', :'analyst_role') \gexec
SELECT format('REVOKE CREATE ON SCHEMA public FROM %I', :'analyst_role') \gexec
SELECT format('GRANT SELECT ON ALL TABLES IN SCHEMA public TO %I', :'analyst_role') \gexec
SELECT format('REVOKE INSERT, UPDATE, DELETE, TRUNCATE, REFERENCES, TRIGGER ON ALL TABLES IN SCHEMA public FROM %I', :'analyst_role') \gexec
SELECT format('REVOKE ALL ON ALL SEQUENCES IN SCHEMA public FROM %I', :'analyst_role') \gexec
-- Tables and views later migrations create (as the database owner) are readable too.
SELECT format('ALTER DEFAULT PRIVILEGES FOR ROLE %I IN SCHEMA public GRANT SELECT ON TABLES TO %I',
              pg_get_userbyid(d.datdba), :'analyst_role')
FROM pg_database d WHERE d.datname = current_database() \gexec
SELECT :'large_objects' = 'allowed'
       AND has_function_privilege('public', 'pg_catalog.lo_create(oid)', 'EXECUTE') AS _lo_open \gset
COMMIT;

\if :_lo_open
\echo analyst role :analyst_role can read database :DBNAME and write nothing but large objects (-v large_objects=allowed)
\else
\echo analyst role :analyst_role can read database :DBNAME and write nothing
\endif
