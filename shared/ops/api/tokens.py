"""Ops tokens: `/v1/tokens…` — minted (shown once), listed, revoked; and `/v1/bootstrap`, the
deployment's first admin token."""

from __future__ import annotations

from datetime import UTC, datetime

from flask import Request, Response

from shared.core.errors import TransientError
from shared.ops import auth
from shared.ops.api.http import (
    Call,
    OpsApi,
    Route,
    json_response,
    read_body,
    unavailable,
    uuid_param,
)
from shared.ops.api.tenants import admin_only, tenant_of
from shared.ops.errors import OpsError, not_found
from shared.ops.models import BootstrapRequest, TokenCreate, TokenList, TokenMinted, TokenSummary
from shared.ops.statements import TOKEN_GET, TOKEN_REVOKE, TOKENS_LIST


def create_token(call: Call) -> TokenMinted:
    """Mint a token, shown once in the answer (the audit row keeps its id, never the token).
    Admin only: a tenant token that could mint tokens could mint itself any role."""
    admin_only(call, "minting a token")
    body: TokenCreate = call.body
    if body.admin == (body.tenant_id is not None):
        raise OpsError(422, "scope_required", "name exactly one of tenant_id and admin")
    if body.admin and body.roles:
        raise OpsError(422, "roles_need_tenant", "roles are a tenant's; an admin token has none")
    if body.expires_at is not None and body.expires_at <= datetime.now(UTC):
        raise OpsError(422, "expired", "expires_at is in the past")
    if body.tenant_id is not None:
        tenant_of(call, body.tenant_id)
    with call.db.transaction() as tx:
        token, token_id = auth.mint_token(
            tx,
            tenant_id=body.tenant_id,
            label=body.label,
            roles=tuple(body.roles),
            expires_at=body.expires_at,
            created_by=call.principal.token_id,
        )
        row = tx.one(TOKEN_GET, token_id=token_id, tenant_id=None)
    return TokenMinted(token=token, details=TokenSummary.model_validate(row))


def list_tokens(call: Call) -> TokenList:
    with call.db.transaction() as tx:
        rows = tx.all(TOKENS_LIST, tenant_id=call.scope)
    return TokenList(items=[TokenSummary.model_validate(r) for r in rows])


def revoke_token(call: Call) -> TokenSummary:
    """Revoke a token at once (its next request is a 401). A tenant token may revoke its own
    tenant's tokens, itself included: revoking only ever takes access away."""
    token_id = uuid_param(call, "token_id", "token")
    with call.db.transaction() as tx:
        row = tx.one(TOKEN_REVOKE, token_id=token_id, tenant_id=call.scope)
        if row is None:
            existing = tx.one(TOKEN_GET, token_id=token_id, tenant_id=call.scope)
            if existing is None:
                raise not_found("token")
            raise OpsError(
                409, "already_revoked", f"token {token_id} was revoked at {existing['revoked_at']}"
            )
    return TokenSummary.model_validate(row)


def bootstrap_token(call: Call) -> TokenMinted:
    """Never called through `run_route`: `bootstrap` below answers this route (it has no
    principal until it has minted one)."""
    raise AssertionError("POST /v1/bootstrap is answered by tokens.bootstrap")


def bootstrap(api: OpsApi, request: Request, route: Route) -> Response:
    """The first admin token of a deployment, for whoever holds the bootstrap secret, once
    ever (auth.mint_bootstrap_token). A wrong secret is a 401 like a wrong token; the right
    one after the bootstrap happened is a 409 (audited: someone still holds that secret)."""
    offered = auth.bearer_from_header(request.headers.get("Authorization"))
    if not auth.bootstrap_secret_matches(offered):
        raise OpsError(
            401,
            "unauthenticated",
            "send the bootstrap secret as 'Authorization: Bearer <secret>'",
            headers={"WWW-Authenticate": 'Bearer realm="onceflow-ops"'},
        )
    body: BootstrapRequest = read_body(request, BootstrapRequest)
    try:
        minted = auth.mint_bootstrap_token(api.db, body.label)
    except TransientError as exc:
        raise unavailable(exc) from exc
    if minted is None:
        auth.record_audit(
            api.db, None, action=route.name, target=None, detail={"outcome": "refused"}
        )
        raise OpsError(
            409,
            "already_bootstrapped",
            "the first admin token was minted already (the bootstrap works once); mint more"
            " with `onceflow tokens create --admin`",
        )
    token, token_id = minted
    auth.record_audit(
        api.db,
        None,
        action=route.name,
        target=token_id,
        detail={"outcome": "done", "label": body.label},
    )
    with api.db.transaction() as tx:
        row = tx.one(TOKEN_GET, token_id=token_id, tenant_id=None)
    return json_response(
        TokenMinted(token=token, details=TokenSummary.model_validate(row)), route.status
    )
