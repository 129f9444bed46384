"""What an approval's summary carries into Slack and into email is text, never markup or a
header (issue 31 item 4, self-review). The summary is rendered from the run's data (a CRM
record's name, a deal's note): whoever can edit a CRM record chooses it. In Slack it must not
become a `<!channel>` ping or a disguised `<url|Approve here>` link (Slack's mrkdwn takes
`<…>` as control sequences; `&`, `<` and `>` must be escaped:
https://api.slack.com/reference/surfaces/formatting#escaping); in an email's Subject a CR/LF
must not start a header of its own (a `Bcc:`), nor stop the sweep sending the others."""

from __future__ import annotations

from typing import Any

from devstack.fakeslack.server import FakeSlack
from devstack.fakesmtp import FakeSmtp
from shared.core.db import Database
from tests.test_approvals_email import ADDRESSES, smtp_fixture  # noqa: F401 - the fixture
from tests.test_approvals_email import _sweep as sweep_all
from tests.test_approvals_slack import _park, _sweep, slack_fixture  # noqa: F401 - the fixture

HOSTILE = "Deal <!channel> <https://evil.test/steal|Approve here> & more *bold*"


def test_a_summary_from_crm_data_is_plain_text_in_slack(db: Database, slack: FakeSlack) -> None:
    _park(db, summary=HOSTILE)
    _sweep(db)
    assert len(slack.messages) == 1
    for message in slack.messages.values():
        for text in [message["text"]] + [
            b["text"]["text"] for b in message["blocks"] if b["type"] == "section"
        ]:
            assert "<!channel>" not in text and "<https://" not in text, text
            assert (
                "&lt;!channel&gt; &lt;https://evil.test/steal|Approve here&gt; &amp; more" in text
            )


def test_a_summary_with_line_breaks_is_one_subject_line_and_the_other_mails_still_go(
    db: Database, smtp: tuple[FakeSmtp, str]
) -> None:
    fake, _ = smtp
    emailed = {"approvers": {"users": list(ADDRESSES)}, "channels": {"email": True}}
    _park(db, summary="Discount\r\nBcc: thief@evil.test\r\n\r\nbody", **emailed)
    _park(db, summary="A plain one", **emailed)
    sweep_all(db)
    got: list[Any] = fake.messages
    assert sorted(r for m in got for r in m.recipients) == sorted(list(ADDRESSES.values()) * 2)
    for m in got:
        subject = m.message["Subject"]
        assert "\r" not in subject and "\n" not in subject
        assert m.message["Bcc"] is None
        assert set(m.message.keys()) == {
            "From", "To", "Subject", "Content-Type", "Content-Transfer-Encoding", "MIME-Version"
        }  # fmt: skip
    assert any("Discount Bcc: thief@evil.test" in m.message["Subject"] for m in got)
