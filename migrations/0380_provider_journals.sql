-- Pull-based event sources: a provider's journal (HubSpot's webhooks journal, issue 26 item 2),
-- read per app after the last committed offset (shared/ingest/journal.py).
--
-- One row per (app, journal) that reads from a journal: its presence is what makes the app a
-- journal reader. `journal` is 'global' (every install of the app) or the portal id of a local
-- journal. `last_offset` is the provider's offset of the last entry stored in the inbox; NULL:
-- nothing read yet (the reader starts at the earliest entry). It moves only in the transaction
-- that stores the entry after it, guarded on its previous value (one reader wins each entry).
CREATE TABLE provider_journals (
    provider        text NOT NULL,
    app_id          text NOT NULL,
    journal         text NOT NULL DEFAULT 'global' CHECK (journal = 'global' OR journal ~ '^[0-9]{1,20}$'),
    last_offset     text,
    entries_read    bigint NOT NULL DEFAULT 0,
    last_entry_at   timestamptz,
    -- The last pass: when it ran, and its error when it failed (health shows it).
    last_pass_at    timestamptz,
    last_error      text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (provider, app_id, journal),
    FOREIGN KEY (provider, app_id) REFERENCES provider_apps (provider, app_id)
);

-- A gap: the stored offset was gone when the reader asked for the entry after it (HubSpot keeps
-- 3 days; a 404 on `…/offset/{offset}/next`), so entries between it and the earliest one still
-- kept may be lost. Recorded in the transaction that resumes from the earliest entry, kept for
-- support (ops health lists the recent ones), never silently skipped.
CREATE TABLE provider_journal_gaps (
    id               bigserial PRIMARY KEY,
    provider         text NOT NULL,
    app_id           text NOT NULL,
    journal          text NOT NULL,
    lost_after       text NOT NULL,      -- the offset that was gone
    resumed_at       text,               -- the earliest offset read instead (NULL: journal empty)
    last_entry_at    timestamptz,        -- when the entry at `lost_after` was stored
    detected_at      timestamptz NOT NULL DEFAULT now(),
    detail           text NOT NULL,
    FOREIGN KEY (provider, app_id, journal) REFERENCES provider_journals (provider, app_id, journal)
);
CREATE INDEX provider_journal_gaps_recent ON provider_journal_gaps (detected_at);
