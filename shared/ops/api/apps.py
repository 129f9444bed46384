"""A provider app and its installs: `/v1/apps/{provider}/{app_id}…`, for the providers the
registry gives apps (shared/providers/registry.py); any other provider is a 404 that says so."""

from __future__ import annotations

from collections.abc import Iterable

from shared.accounts import provider_apps
from shared.accounts.provider_apps import ProviderApp
from shared.core.settings import settings
from shared.ingest import journal
from shared.ingest.app_webhook import app_path
from shared.ops import installs
from shared.ops.api.http import Call
from shared.ops.errors import OpsError, not_found
from shared.ops.models import (
    AppProjectReport,
    InstallConfirmed,
    InstallStarted,
    JournalGap,
    JournalState,
    ProjectDeclaration,
    ProjectSubscription,
    ProviderAppReport,
    UnroutedPortal,
)
from shared.providers import install as oauth_install
from shared.providers import registry
from shared.providers.install import InstallRefused
from shared.publishing import subscriptions
from shared.publishing.subscriptions import SubscriptionKey, last_app_reconcile


def _provider(call: Call, offered: tuple[str, ...], what: str) -> str:
    """The path's provider, when the registry gives it `what`; a 404 naming the reason if not."""
    name = call.path["provider"]
    if name not in offered:
        known = registry.get(name) is not None
        raise OpsError(
            404,
            "not_found",
            f"provider {name!r} has no {what}" if known else f"no such provider {name!r}",
        )
    return name


def provider_app_report(call: Call) -> ProviderAppReport:
    """An app spans tenants (one URL for every portal that installed it): operator only; a
    tenant's token gets the 404 an unknown app gets."""
    if call.scope is not None:
        raise not_found("provider app")
    with call.db.transaction() as tx:
        app = provider_apps.get_app(
            tx, _provider(call, registry.app_providers(), "apps"), call.path["app_id"]
        )
        if app is None:
            raise not_found("provider app")
        unrouted = provider_apps.unrouted_summary(tx, app.provider, app.app_id)
        journals = journal.app_journals(tx, app.provider, app.app_id)
    last = last_app_reconcile(call.db, app.provider, app.app_id)
    return ProviderAppReport(
        provider=app.provider,
        app_id=app.app_id,
        kind=app.kind,
        platform=app.platform,
        unrouted=[UnroutedPortal.model_validate(row) for row in unrouted],
        subscriptions=dict(last) if last else None,
        journals=[
            JournalState.model_validate(
                {**j, "gaps": [JournalGap.model_validate(g) for g in j["gaps"]]}
            )
            for j in journals
        ],
    )


def install_app(call: Call) -> InstallStarted:
    """Start installing a provider's app on an account for a tenant (shared/ops/installs.py)."""
    provider = _provider(call, registry.oauth_providers(), "app installed with OAuth")
    return installs.start(call.db, call.principal, provider, call.path["app_id"], call.body)


def confirm_app_install(call: Call) -> InstallConfirmed:
    """Confirm an install with the code its callback page showed (shared/ops/installs.py)."""
    provider = _provider(call, registry.oauth_providers(), "app installed with OAuth")
    return installs.confirm(call.db, call.principal, provider, call.path["app_id"], call.body)


def claim_app_install(call: Call) -> InstallConfirmed:
    """Claim an install that started at the provider (shared/ops/installs.py)."""
    provider = _provider(call, registry.oauth_providers(), "app installed with OAuth")
    return installs.claim(call.db, call.principal, provider, call.path["app_id"], call.body)


def _project_app(call: Call) -> ProviderApp:
    """The path's app, of a provider whose apps can be projects; operator only (an app spans
    tenants), a tenant's token gets the 404 an unknown app gets."""
    if call.scope is not None:
        raise not_found("provider app")
    provider = _provider(call, registry.project_providers(), "project-based apps")
    with call.db.transaction() as tx:
        app = provider_apps.get_app(tx, provider, call.path["app_id"])
    if app is None:
        raise not_found("provider app")
    return app


def _subscriptions(keys: Iterable[SubscriptionKey]) -> list[ProjectSubscription]:
    return [
        ProjectSubscription(object_type=o, event_kind=k, property_name=p)
        for o, k, p in sorted(keys, key=lambda k: (k[0], k[1], k[2] or ""))
    ]


def _project_report(call: Call, app: ProviderApp) -> AppProjectReport:
    desired = subscriptions.desired_for_app(call.db, app)
    declared = subscriptions.declared_of(app)
    config = settings()
    redirect = (config.oauth_redirect_url or "").strip()
    public = (config.public_url or "").strip().rstrip("/")
    return AppProjectReport(
        provider=app.provider,
        app_id=app.app_id,
        platform=app.platform,
        scopes=list(app.oauth_scopes),
        # The app's own callback first: HubSpot's install URL and Marketplace installs come
        # back to a redirect URL of the app with no state of ours (docs do not say which one
        # when several are listed; not confirmed), and only that path names the app.
        redirect_urls=[u for u in (_own_callback(app), redirect) if u],
        target_url=(public + app_path(app.provider, app.app_id)) if public else None,
        needed=_subscriptions(desired.keys),
        unsupported=list(desired.unsupported),
        declared=None if app.project_declared is None else _subscriptions(declared),
        declared_at=app.project_declared_at,
        missing=_subscriptions(desired.keys - declared),
    )


def _own_callback(app: ProviderApp) -> str | None:
    try:
        return oauth_install.app_callback_url(app.app_id, app.provider)
    except InstallRefused:  # ONCEFLOW_OAUTH_REDIRECT_URL not set: no install can come back
        return None


def app_project(call: Call) -> AppProjectReport:
    """What `onceflow <provider> project` writes into a project-based app's files."""
    return _project_report(call, _project_app(call))


def declare_app_project(call: Call) -> AppProjectReport:
    """Keep what the app's project files declare after `onceflow <provider> project` wrote
    them: the declaration drift is measured against (the deployment can't read the files)."""
    body: ProjectDeclaration = call.body
    app = _project_app(call)
    if app.platform != "project":
        raise OpsError(
            409,
            "not_a_project_app",
            f"app {app.app_id} is a legacy app: its subscriptions are kept through the"
            " provider's API or UI, not project files",
        )
    keys = [(s.object_type, s.event_kind, s.property_name) for s in body.subscriptions]
    if not subscriptions.record_project_declaration(call.db, app.provider, app.app_id, keys):
        raise not_found("provider app")
    return app_project(call)
