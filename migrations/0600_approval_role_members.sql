-- An approval named by role alone reaches people too (issue 31, item 4): its email asks,
-- reminders and escalations go to the role's members, and its Slack reminders mention them.
-- Who holds a role is where the ops page and the Slack route already look: the labels of the
-- tenant's live ops tokens that carry it (shared/steps/parks.may_decide decides by the same).

-- The one definition of a live ops token: not revoked, not expired.
CREATE VIEW ops_tokens_live AS
SELECT * FROM ops_tokens
WHERE revoked_at IS NULL AND (expires_at IS NULL OR expires_at > now());

-- The users holding `p_role` in `p_tenant`, by label, sorted; '{}' for a NULL role. With
-- `p_channel` (slack | email), only those mapped to an identity there: a role may be carried
-- by many tokens (a CI job's, a bot's), and an email to a user with no address would only
-- fail, five times, with a warning each.
CREATE FUNCTION onceflow_role_members(p_tenant text, p_role text, p_channel text DEFAULT NULL)
RETURNS text[]
LANGUAGE sql STABLE AS $$
    SELECT coalesce(array_agg(DISTINCT t.label ORDER BY t.label), '{}')
    FROM ops_tokens_live t
    WHERE t.tenant_id = p_tenant AND p_role = ANY (t.roles)
      AND (p_channel IS NULL
           OR EXISTS (SELECT 1 FROM approver_identities i
                      WHERE i.tenant_id = p_tenant AND i.channel = p_channel
                        AND i.onceflow_user = t.label))
$$;

-- The roles of user `p_user` in `p_tenant`: those of their live ops tokens, sorted. What a
-- Slack click's or a mailed link's user may decide is judged by these at the moment they
-- decide (a revoked token takes its roles with it).
CREATE FUNCTION onceflow_user_roles(p_tenant text, p_user text) RETURNS text[]
LANGUAGE sql STABLE AS $$
    SELECT coalesce(array_agg(DISTINCT r ORDER BY r), '{}')
    FROM ops_tokens_live t, unnest(t.roles) AS r
    WHERE t.tenant_id = p_tenant AND t.label = p_user
$$;
