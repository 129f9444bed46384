"""The ground floor: the database, named SQL, migrations, logs, errors, Pub/Sub, the
network guard, request bodies and the table of deployed functions. Imports nothing above it."""
