"""The ops JSON API, split by what each part knows.

- `app`: the `ops` function's app — the router over the route table, `/openapi.json`, and
  the switch that sends `/ui` to the page.
- `http`: what every route shares — `Call`, `Route`, the token check, query and body
  parsing, the error model and the audit.
- `routes`: the route declaration, the one `ROUTES` table that drives dispatch and
  `/openapi.json`.
- one module per resource (`runs`, `approvals`, `events`, `records`, `credits`, `workflows`,
  `rehearsals`, `health`, `tenants`, `connections`, `tokens`, `apps`): its handlers and the
  statements they read.
"""
