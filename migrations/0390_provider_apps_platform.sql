-- Project-based apps (issue 26, item 1). HubSpot closed legacy public apps to new developers in
-- 2026; a new app is a project (developer platform 2026.03) whose webhook subscriptions are
-- declared in a component file (`src/app/webhooks/webhooks-hsmeta.json`) deployed with
-- `hs project upload`, and the `/webhooks/v3/{appId}/subscriptions` API onceflow's reconcile
-- calls "can only be used with legacy public apps" (docs/vendors/hubspot-2026.md section 1).
-- So an app declares which platform it is on, and that chooses how its subscriptions are kept:
-- legacy (as before: the API for a public app, the UI for a private one) or project (files
-- written by `onceflow <provider> project`, drift reported, nothing called).
--
-- project_declared: the subscriptions the app's project files declared when onceflow last wrote
-- them (read back from the files after the write, so what a person kept or added counts), as
-- {"subscriptions": [{"object_type", "event_kind", "property_name"}]}; with its time. HubSpot
-- offers no API to read a project's components back, and ops and the sweep run where the
-- project directory is not: this record is the only declaration they can compare with.
ALTER TABLE provider_apps
    ADD COLUMN platform            text NOT NULL DEFAULT 'legacy'
                                   CHECK (platform IN ('legacy', 'project')),
    ADD COLUMN project_declared    jsonb,
    ADD COLUMN project_declared_at timestamptz,
    ADD CONSTRAINT provider_apps_declared_only_for_projects
        CHECK (project_declared IS NULL OR platform = 'project'),
    ADD CONSTRAINT provider_apps_declared_with_time
        CHECK ((project_declared IS NULL) = (project_declared_at IS NULL));
