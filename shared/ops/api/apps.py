"""A provider app and its installs: `/v1/apps/{provider}/{app_id}…`, for the providers the
registry gives apps (shared/providers/registry.py); any other provider is a 404 that says so."""

from __future__ import annotations

from shared.accounts import provider_apps
from shared.ingest import journal
from shared.ops import installs
from shared.ops.api.http import Call
from shared.ops.errors import OpsError, not_found
from shared.ops.models import (
    InstallConfirmed,
    InstallStarted,
    JournalGap,
    JournalState,
    ProviderAppReport,
    UnroutedPortal,
)
from shared.providers import registry
from shared.publishing.subscriptions import last_app_reconcile


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
