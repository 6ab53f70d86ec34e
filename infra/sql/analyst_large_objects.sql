-- Stop every role but the database owner from creating large objects (PostgreSQL), as a
-- superuser, once per database:
--
--   psql -X "postgresql://SUPERUSER@HOST/DATABASE" -f infra/sql/analyst_large_objects.sql
--
-- PostgreSQL has no privilege for creating large objects: any role that can connect can
-- run lo_create and keep a lasting object. Taking EXECUTE on the creating functions away
-- from PUBLIC is the only way to stop it, and those functions belong to the system, so a
-- superuser must do it (the database owner then runs infra/sql/analyst_role.sql). epiflow
-- itself uses no large objects; the owner keeps the right to create them.
\set ON_ERROR_STOP on
\set QUIET on
\set VERBOSITY terse
BEGIN;
DO $check$
BEGIN
    IF NOT (SELECT rolsuper FROM pg_roles WHERE rolname = current_user) THEN
        RAISE EXCEPTION 'analyst_large_objects.sql needs a superuser (only one may change pg_catalog functions); % is not one', current_user;
    END IF;
END
$check$;
REVOKE EXECUTE ON FUNCTION pg_catalog.lo_create(oid), pg_catalog.lo_creat(integer),
    pg_catalog.lo_from_bytea(oid, bytea), pg_catalog.lo_import(text),
    pg_catalog.lo_import(text, oid) FROM PUBLIC;
SELECT format(
    'GRANT EXECUTE ON FUNCTION pg_catalog.lo_create(oid), pg_catalog.lo_creat(integer), '
    'pg_catalog.lo_from_bytea(oid, bytea) TO %I', pg_get_userbyid(d.datdba))
FROM pg_database d WHERE d.datname = current_database() \gexec
COMMIT;
\echo large objects: only the owner of database :DBNAME and superusers can create them
