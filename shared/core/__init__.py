"""The ground floor: the database, named SQL, migrations, logs, errors, Pub/Sub, the
network guard, request bodies, the table of deployed functions and the test-only kill switches
(`crashpoints`, armed by the crash tests in every wing that writes). Imports nothing above it."""
