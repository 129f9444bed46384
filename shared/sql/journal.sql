-- Provider journals read by offset (shared/ingest/journal.py; migration 0380).

-- name: journal_enable
-- An app reads this journal from now on; enabling it again changes nothing (its offset stays).
INSERT INTO provider_journals (provider, app_id, journal)
VALUES (:provider, :app_id, :journal)
ON CONFLICT (provider, app_id, journal) DO NOTHING

-- name: journal_list
-- Every journal read, for the scheduled pass.
SELECT provider, app_id, journal, last_offset
  FROM provider_journals
 ORDER BY provider, app_id, journal

-- name: journal_get
SELECT provider, app_id, journal, last_offset, entries_read, last_entry_at, last_pass_at,
       last_error
  FROM provider_journals
 WHERE provider = :provider AND app_id = :app_id AND journal = :journal

-- name: journal_advance
-- In the transaction that stored the entry at :new_offset in the inbox. Guarded on the offset
-- this reader read the entry after (NULL: none yet): of two readers that fetched the same
-- entry, the first to commit moves the offset; the second, re-checking the row after the first
-- committed, matches zero rows and rolls its whole transaction back (its inbox write with it),
-- so an entry is stored once and none is skipped.
UPDATE provider_journals
   SET last_offset = :new_offset, entries_read = entries_read + 1, last_entry_at = now()
 WHERE provider = :provider AND app_id = :app_id AND journal = :journal
   AND last_offset IS NOT DISTINCT FROM :expected
RETURNING last_offset

-- name: journal_note_pass
-- How the last pass ended (no guard: a note for health, the later pass's note is the truth).
UPDATE provider_journals
   SET last_pass_at = now(), last_error = :error
 WHERE provider = :provider AND app_id = :app_id AND journal = :journal

-- name: journal_record_gap
-- In the same transaction as the guarded `journal_advance` that resumes at the earliest entry:
-- the gap is recorded exactly when the offset jumps, by the reader that won the jump.
INSERT INTO provider_journal_gaps (provider, app_id, journal, lost_after, resumed_at,
                                   last_entry_at, detail)
SELECT provider, app_id, journal, :lost_after, :resumed_at, last_entry_at, :detail
  FROM provider_journals
 WHERE provider = :provider AND app_id = :app_id AND journal = :journal
RETURNING id

-- name: journal_recent_gaps
-- Support and health: the gaps found in the last :days days, newest first.
SELECT id, provider, app_id, journal, lost_after, resumed_at, last_entry_at, detected_at,
       detail
  FROM provider_journal_gaps
 WHERE detected_at >= now() - make_interval(days => :days)
 ORDER BY detected_at DESC, id DESC

-- name: journal_reset
-- The stored offset is gone and the journal holds nothing older to resume from: read from the
-- earliest entry next time. Guarded like `journal_advance` (zero rows: another reader moved it).
UPDATE provider_journals
   SET last_offset = NULL
 WHERE provider = :provider AND app_id = :app_id AND journal = :journal
   AND last_offset IS NOT DISTINCT FROM :expected
RETURNING journal

-- name: journal_of_app
-- The journals an app reads (none: its events come by webhook only).
SELECT journal FROM provider_journals
 WHERE provider = :provider AND app_id = :app_id
 ORDER BY journal

-- name: journal_app_accounts
-- The accounts (portals) with an active connection of the app: whose journal subscriptions
-- the reconcile keeps (shared/publishing/subscriptions.py).
SELECT DISTINCT provider_account_id AS account_id
  FROM connections
 WHERE provider = :provider AND provider_app_id = :app_id AND status = 'active'
   AND provider_account_id IS NOT NULL
 ORDER BY provider_account_id
