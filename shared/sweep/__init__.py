"""The sweep wing: the scheduled loop (`loop`) over the catalog of what it runs (`catalog`),
and the duties that belong to no lower wing: retention and the backlog report."""
