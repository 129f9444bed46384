"""A HubSpot project-based app's files (developer platform 2026.03), written and updated for
`onceflow hubspot project DIR` and deployed by a person with `hs project upload`.

Legacy public apps can no longer be created, and the `/webhooks/v3/{appId}/subscriptions` API
the legacy reconcile calls "can only be used with legacy public apps"; a project app declares
its webhooks in a component file instead (docs/vendors/hubspot-2026.md section 1). The layout
(sources: HubSpot/hubspot-project-components `2026.03-beta/defaultFiles/hsproject.json` and
`2025.2/components/app/oauth-*/src/app/app-hsmeta.json`;
https://developers.hubspot.com/docs/apps/developer-platform/build-apps/app-configuration and
https://developers.hubspot.com/docs/apps/developer-platform/add-features/configure-webhooks):

- `hsproject.json`: `{"name", "srcDir": "src", "platformVersion": "2026.03"}`;
- `src/app/app-hsmeta.json`: `{"uid", "type": "app", "config": {"name", "distribution",
  "auth": {"type": "oauth", "redirectUrls", "requiredScopes", ...}, "support", ...}}`;
- `src/app/webhooks/webhooks-hsmeta.json`: `{"uid", "type": "webhooks", "config": {"settings":
  {"targetUrl", "maxConcurrentRequests"}, "subscriptions": {"crmObjects", "legacyCrmObjects",
  "hubEvents"}}}` (any `*-hsmeta.json` of type `webhooks` under `src/app/webhooks/` is it).

What onceflow owns, and rewrites on each update: the app's `auth.type`, `redirectUrls` (ours
first, any other a person listed kept after them) and `requiredScopes` (exactly the app row's
`oauth_scopes`: the authorize URL onceflow sends asks for those, and HubSpot wants the two to
agree); the webhooks' `targetUrl` (the app's one URL on the webhook function) and the
`legacyCrmObjects` list plus the `*.privacyDeletion` entries of `hubEvents` — exactly the
subscriptions the active workflows need, as the legacy reconcile keeps an app's API
subscriptions. They are written in the legacy `<object>.<kind>` form because that is the
payload the normalizer reads (`subscriptionType: contact.propertyChange`, normalize.py), the
same events the v3 API subscribed to. Everything else is a person's and kept as it is: other
components, `support`, `permittedUrls`, `distribution`, optional scopes, `crmObjects` (the new
generic form, which onceflow never writes but counts as declared when a person does), other
`hubEvents` (`conversation.*`), unknown keys.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from shared.providers.descriptor import AppProject, ProjectSpec, SubscriptionKey

PLATFORM_VERSION = "2026.03"  # docs/vendors/hubspot-2026.md 1.1
APP_FILE = Path("src/app/app-hsmeta.json")
WEBHOOKS_DIR = Path("src/app/webhooks")
WEBHOOKS_FILE = WEBHOOKS_DIR / "webhooks-hsmeta.json"
# "upper threshold of HTTP requests HubSpot will make in a given time frame" (configure-webhooks
# field table); the template's value, kept when a person set another.
MAX_CONCURRENT_REQUESTS = 10
PRIVACY_DELETION = "privacyDeletion"  # the one kind HubSpot lists under `hubEvents`
DEPLOY_HINT = "hs project upload"


class ProjectFileInvalid(ValueError):
    """A project file that exists but is not the JSON object HubSpot's CLI reads: left alone,
    never overwritten with a guess."""


def _load(path: Path) -> dict[str, Any] | None:
    if not path.exists():
        return None
    try:
        loaded = json.loads(path.read_text("utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise ProjectFileInvalid(f"{path}: not JSON ({exc})") from None
    if not isinstance(loaded, dict):
        raise ProjectFileInvalid(f"{path}: not a JSON object")
    return loaded


def _save(path: Path, document: Mapping[str, Any]) -> None:
    """Written whole through a temporary file and a rename: an interrupted write leaves the
    previous file, never half of one for `hs project upload` to deploy."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(document, indent=2) + "\n", "utf-8")
    os.replace(tmp, path)


def _object(parent: dict[str, Any], key: str) -> dict[str, Any]:
    """`parent[key]` as an object, made when missing (a person's non-object is replaced:
    HubSpot's CLI would refuse it anyway)."""
    found = parent.get(key)
    if not isinstance(found, dict):
        found = parent[key] = {}
    return found


def _entries(value: Any) -> list[dict[str, Any]]:
    return [e for e in value if isinstance(e, dict)] if isinstance(value, list) else []


def webhooks_file(root: Path) -> Path:
    """The project's webhooks component: the `*-hsmeta.json` of type `webhooks` in
    `src/app/webhooks/` (its name may have any prefix), or where a new one goes."""
    folder = root / WEBHOOKS_DIR
    for path in sorted(folder.glob("*-hsmeta.json")) if folder.is_dir() else []:
        loaded = _load(path)
        if loaded is not None and loaded.get("type") == "webhooks":
            return path
    return root / WEBHOOKS_FILE


# ---- subscriptions <-> component entries ----------------------------------------------------


def entry_for(key: SubscriptionKey) -> tuple[str, dict[str, Any]]:
    """(list name, entry) declaring one subscription in the legacy form."""
    object_type, kind, prop = key
    entry: dict[str, Any] = {"subscriptionType": f"{object_type}.{kind}"}
    if prop is not None:
        entry["propertyName"] = prop
    entry["active"] = True
    return ("hubEvents" if kind == PRIVACY_DELETION else "legacyCrmObjects"), entry


def _legacy_key(entry: Mapping[str, Any]) -> SubscriptionKey | None:
    kind = entry.get("subscriptionType")
    if not isinstance(kind, str) or kind.count(".") != 1:
        return None
    object_type, event_kind = kind.split(".")
    prop = entry.get("propertyName")
    return (object_type, event_kind, prop if isinstance(prop, str) else None)


def _generic_key(entry: Mapping[str, Any]) -> SubscriptionKey | None:
    """`object.propertyChange` with `objectType: contact` is (contact, propertyChange, prop)."""
    kind, object_type = entry.get("subscriptionType"), entry.get("objectType")
    if not (isinstance(kind, str) and kind.startswith("object.") and isinstance(object_type, str)):
        return None
    prop = entry.get("propertyName")
    return (object_type.lower(), kind[len("object.") :], prop if isinstance(prop, str) else None)


def _ours(list_name: str, entry: Mapping[str, Any]) -> bool:
    """Whether onceflow rewrites this entry (see the module docstring)."""
    if list_name == "legacyCrmObjects":
        return True
    key = _legacy_key(entry) if list_name == "hubEvents" else None
    return key is not None and key[1] == PRIVACY_DELETION


def declared(webhooks: Mapping[str, Any] | None) -> frozenset[SubscriptionKey]:
    """The active subscriptions a webhooks component declares, in all three lists."""
    if webhooks is None:
        return frozenset()
    config = webhooks.get("config")
    subs = config.get("subscriptions") if isinstance(config, dict) else None
    if not isinstance(subs, dict):
        return frozenset()
    found: set[SubscriptionKey] = set()
    for list_name, read in (
        ("legacyCrmObjects", _legacy_key),
        ("hubEvents", _legacy_key),
        ("crmObjects", _generic_key),
    ):
        for entry in _entries(subs.get(list_name)):
            key = read(entry)
            if key is not None and entry.get("active", True) is not False:
                found.add(key)
    return frozenset(found)


def _sorted(keys: Iterable[SubscriptionKey]) -> list[SubscriptionKey]:
    return sorted(keys, key=lambda k: (k[0], k[1], k[2] or ""))


# ---- the three files ------------------------------------------------------------------------


def updated_webhooks(existing: Mapping[str, Any] | None, spec: ProjectSpec) -> dict[str, Any]:
    document: dict[str, Any] = json.loads(json.dumps(existing)) if existing else {}
    document.setdefault("uid", "webhooks")
    document["type"] = "webhooks"
    config = _object(document, "config")
    settings = _object(config, "settings")
    if spec.target_url is not None:
        settings["targetUrl"] = spec.target_url
    settings.setdefault("maxConcurrentRequests", MAX_CONCURRENT_REQUESTS)
    subs = _object(config, "subscriptions")
    kept = {
        name: [e for e in _entries(subs.get(name)) if not _ours(name, e)]
        for name in ("crmObjects", "legacyCrmObjects", "hubEvents")
    }
    for key in _sorted(spec.subscriptions):
        list_name, entry = entry_for(key)
        kept[list_name].append(entry)
    subs.update(kept)
    return document


def updated_app(existing: Mapping[str, Any] | None, spec: ProjectSpec) -> dict[str, Any]:
    document: dict[str, Any] = json.loads(json.dumps(existing)) if existing else {}
    document.setdefault("uid", f"onceflow_app_{spec.app_id}")
    document["type"] = "app"
    config = _object(document, "config")
    config.setdefault("name", spec.name)
    config.setdefault("description", "Runs onceflow workflows on this account's CRM events.")
    # OAuth "is required for multiple accounts" (authentication overview); `private` until a
    # person lists it on the Marketplace (the template's other value, `marketplace`).
    config.setdefault("distribution", "private")
    auth = _object(config, "auth")
    auth["type"] = "oauth"
    theirs = [u for u in auth.get("redirectUrls") or [] if isinstance(u, str)]
    auth["redirectUrls"] = list(dict.fromkeys([*spec.redirect_urls, *theirs]))
    auth["requiredScopes"] = list(spec.scopes)
    auth.setdefault("optionalScopes", [])
    auth.setdefault("conditionallyRequiredScopes", [])
    return document


def write_project(root: Path, spec: ProjectSpec) -> frozenset[SubscriptionKey]:
    """Write or update the project under `root`; the subscriptions it declares afterwards.
    Raises ProjectFileInvalid (nothing written) when a file it would update is not JSON."""
    project_path, app_path, hooks_path = (
        root / "hsproject.json",
        root / APP_FILE,
        webhooks_file(root),
    )
    project, app, hooks = _load(project_path), _load(app_path), _load(hooks_path)
    if project is None:
        name = spec.name.lower().replace(" ", "-")
        _save(project_path, {"name": name, "srcDir": "src", "platformVersion": PLATFORM_VERSION})
    _save(app_path, updated_app(app, spec))
    _save(hooks_path, updated_webhooks(hooks, spec))
    return read_declared(root)


def read_declared(root: Path) -> frozenset[SubscriptionKey]:
    return declared(_load(webhooks_file(root)))


PROJECT = AppProject(write=write_project, read_declared=read_declared, deploy_hint=DEPLOY_HINT)
