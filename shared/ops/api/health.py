"""Health: `/v1/health` — is the machinery running (shared/ops/health.py)."""

from __future__ import annotations

from shared.ops import health
from shared.ops.api.http import Call
from shared.ops.models import HealthReport


def get_health(call: Call) -> HealthReport:
    return health.health_report(call.db, call.principal)
