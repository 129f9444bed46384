"""A provider app and its installs: `/v1/apps/hubspot/{app_id}…`."""

from __future__ import annotations

from shared.accounts import provider_apps
from shared.ops import installs
from shared.ops.api.http import Call
from shared.ops.errors import not_found
from shared.ops.models import InstallConfirmed, InstallStarted, ProviderAppReport, UnroutedPortal
from shared.publishing.subscriptions import last_app_reconcile


def provider_app_report(call: Call) -> ProviderAppReport:
    """An app spans tenants (one URL for every portal that installed it): operator only; a
    tenant's token gets the 404 an unknown app gets."""
    if call.scope is not None:
        raise not_found("provider app")
    with call.db.transaction() as tx:
        app = provider_apps.get_app(tx, "hubspot", call.path["app_id"])
        if app is None:
            raise not_found("provider app")
        unrouted = provider_apps.unrouted_summary(tx, app.provider, app.app_id)
    last = last_app_reconcile(call.db, app.provider, app.app_id)
    return ProviderAppReport(
        provider=app.provider,
        app_id=app.app_id,
        kind=app.kind,
        unrouted=[UnroutedPortal.model_validate(row) for row in unrouted],
        subscriptions=dict(last) if last else None,
    )


def install_app(call: Call) -> InstallStarted:
    """Start installing the HubSpot app on a portal for a tenant (shared/ops/installs.py)."""
    return installs.start(call.db, call.principal, call.path["app_id"], call.body)


def confirm_app_install(call: Call) -> InstallConfirmed:
    """Confirm an install with the code its callback page showed (shared/ops/installs.py)."""
    return installs.confirm(call.db, call.principal, call.path["app_id"], call.body)
