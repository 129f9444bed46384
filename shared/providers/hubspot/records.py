"""HubSpot record pages: the addresses support people paste into search, and the "open in
HubSpot" links of the ops page (both through `Crm.record_pages`, shared/ops/search.py).

A record page is `https://app.hubspot.com/contacts/<portal>/record/<objectTypeId>/<id>` (the
EU data centre's host is `app-eu1.hubspot.com`); older links read
`/contacts/<portal>/<contact|company|deal|ticket>/<id>`. Object type ids are the ones webhook
events carry (`0-1` contact, ...: normalize.py).
"""

from __future__ import annotations

import re

from shared.providers.descriptor import RecordPages
from shared.providers.hubspot.normalize import object_type_for, type_id_for

_HOST = re.compile(r"^app(-[a-z0-9]+)?\.hubspot\.com$")
# /contacts/<portal>/record/<type id>/<object id>, and the older /contacts/<portal>/<type>/<id>.
_RECORD_PATH = re.compile(r"^/contacts/(\d{1,20})/record/(\d+-\d+)/(\d{1,30})(?:/.*)?$")
_LEGACY_PATH = re.compile(
    r"^/contacts/(\d{1,20})/(contact|company|deal|ticket)/(\d{1,30})(?:/.*)?$"
)


def owns(hostname: str) -> bool:
    return _HOST.match(hostname) is not None


def locate(path: str) -> tuple[str, str, str] | None:
    """(portal id, object type, object id) of a record page's path; None for any other."""
    found = _RECORD_PATH.match(path)
    if found:
        return found[1], object_type_for(found[2]), found[3]
    legacy = _LEGACY_PATH.match(path)
    if legacy:
        return legacy[1], legacy[2], legacy[3]
    return None


def url(portal_id: str, object_type: str, object_id: str) -> str | None:
    """The record's page in the portal; custom objects (`object_2_123`) by their type id."""
    type_id = type_id_for(object_type) or (
        object_type.removeprefix("object_").replace("_", "-")
        if object_type.startswith("object_")
        else None
    )
    if type_id is None:
        return None
    return f"https://app.hubspot.com/contacts/{portal_id}/record/{type_id}/{object_id}"


RECORD_PAGES = RecordPages(
    site="app.hubspot.com",
    page_shape="/contacts/<portal>/record/<type>/<id>",
    owns=owns,
    locate=locate,
    url=url,
)
