"""ai.generate: one answer from a Gemini model on Vertex AI, through Google's own SDK
(`google-genai`), inside the guarantees every other side effect has.

- The prompt is a template over the run's scope (rendered with the rest of the step's config
  by the engine, shared/steps/advance.py `render_config`).
- The answer must satisfy the step's JSON Schema: it is requested as structured output
  (`generationConfig.responseMimeType = application/json` + `responseJsonSchema`,
  https://docs.cloud.google.com/vertex-ai/generative-ai/docs/multimodal/control-generated-output)
  and checked again on receipt (shared/blocks/answer_schema.py). An answer that breaks it is a
  transient failure `AI_ANSWER_INVALID`: the step's next attempt asks again, and the last one
  fails with the validation error.
- Errors follow Vertex AI's table (https://docs.cloud.google.com/vertex-ai/generative-ai/docs/model-reference/api-errors):
  429 `RESOURCE_EXHAUSTED` is transient (the step's journaled backoff; the SDK's own retry is
  off, so there is one retry schedule, not two) and proves nothing was generated; 400
  `INVALID_ARGUMENT` is permanent; other statuses by the one rule (`classify_status`).
- Gates, declared below, not called here: the workflow's and the Vertex host's windows, the
  budget reservation and the charge (once per lineage key, so attempts and replays of the step
  are charged once). The answer is the step's output, journaled with it: a replay copies the
  settled step and never asks the model again (shared/ops/replay_plan.py).
- Journaled: a conforming answer is committed under the step's lineage key as soon as it is
  received (ai_answers, migration 0441), before the step settles; another attempt of the same
  key asking the same request (the retry after a lost lease or a crash, a replay that starts
  the step again) reuses it without calling the model (`AI_ANSWER_REUSED`).
- A rehearsal calls nothing: the step's `rehearsal_answer` (or the smallest answer the schema
  allows) is its output, shown with the prompt it would have sent.

Where the call goes: the tenant's project, location and default model (tenants.vertex_*,
migration 0440), as the function's service account (Application Default Credentials, which
the SDK loads itself when given none). `ONCEFLOW_VERTEX_BASE_URL` (tests, the local stack)
sends it to the fake in devstack/fakevertex with a static token instead.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from shared.blocks import answer_schema
from shared.blocks.base import (
    BlockContext,
    BlockFailure,
    BlockResult,
    BlockSpec,
    Gate,
    RetryPolicy,
    Target,
    TokenPrice,
    dry_run_result,
)
from shared.core import queries
from shared.core.errors import classify_status
from shared.core.settings import settings

SQL = queries.load("ai")
TENANT_VERTEX = SQL["tenant_vertex_settings"]
ANSWER_GET = SQL["ai_answer_get"]
ANSWER_PUT = SQL["ai_answer_put"]

DEFAULT_MODEL = "gemini-2.5-flash"
DEFAULT_LOCATION = "global"
TIMEOUT_MS = 60_000
# A stand-in bearer token for the fake endpoint: with a base URL set nothing goes to Google.
FAKE_TOKEN = "onceflow-fake-vertex"  # noqa: S105 - not a secret

OUTCOME_ANSWER_INVALID = "AI_ANSWER_INVALID"
OUTCOME_RESOURCE_EXHAUSTED = "AI_RESOURCE_EXHAUSTED"
OUTCOME_INVALID_ARGUMENT = "AI_INVALID_ARGUMENT"
OUTCOME_NOT_CONFIGURED = "AI_NOT_CONFIGURED"
OUTCOME_ANSWER_REUSED = "AI_ANSWER_REUSED"


class AiConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)
    prompt: str = Field(min_length=1, max_length=32_000)
    # `schema` in the definition (a BaseModel attribute name, hence the alias).
    answer_schema: dict[str, Any] = Field(alias="schema")
    model: str | None = Field(default=None, pattern=r"^[A-Za-z0-9._-]{1,100}$")
    temperature: float = Field(default=0.0, ge=0.0, le=2.0)
    max_output_tokens: int = Field(default=1024, ge=1, le=8192)
    # What a rehearsal shows as the answer; None: the smallest answer the schema allows.
    rehearsal_answer: Any = None

    @field_validator("answer_schema")
    @classmethod
    def _checkable(cls, value: dict[str, Any]) -> dict[str, Any]:
        problems = answer_schema.unsupported(value)
        if problems:
            raise ValueError("; ".join(problems))
        return value

    @model_validator(mode="after")
    def _rehearsal_answer_conforms(self) -> AiConfig:
        if self.rehearsal_answer is not None:
            problems = answer_schema.violations(self.rehearsal_answer, self.answer_schema)
            if problems:
                raise ValueError(f"rehearsal_answer breaks the schema: {'; '.join(problems)}")
        return self


def _vertex(ctx: BlockContext) -> tuple[str, str, str | None]:
    """(project, location, tenant's default model) for this tenant's calls."""
    tenant_id = ctx.tenant_id
    with ctx.database().transaction() as tx:
        row = tx.one(TENANT_VERTEX, tenant_id=tenant_id)
    row = row or {}
    project = row.get("vertex_project") or settings().google_cloud_project
    if not project:
        raise BlockFailure(
            f"tenant {tenant_id} has no Vertex AI project and GOOGLE_CLOUD_PROJECT is unset",
            error_class="permanent",
            outcome_code=OUTCOME_NOT_CONFIGURED,
            not_applied=True,
        )
    return project, row.get("vertex_location") or DEFAULT_LOCATION, row.get("vertex_model")


def _host(location: str) -> str:
    base = settings().vertex_base_url
    if base:
        return urlsplit(base).hostname or "localhost"
    # Regional endpoints are `{location}-aiplatform.googleapis.com`, the global one has none.
    return (
        "aiplatform.googleapis.com"
        if location == "global"
        else f"{location}-aiplatform.googleapis.com"
    )


def vertex_target(ctx: BlockContext, config: BaseModel) -> Target:
    """The host the call goes to, for the host limit (a tenant's `host_rate_limit` on it caps
    its model calls per window like any other destination)."""
    _, location, _ = _vertex(ctx)
    return Target(host=_host(location))


def _client(project: str, location: str) -> Any:
    from google import genai
    from google.genai import types

    base = settings().vertex_base_url
    credentials = None
    if base:
        from google.oauth2.credentials import Credentials

        # A token with no expiry is never refreshed: the SDK sends it as it is.
        credentials = Credentials(token=FAKE_TOKEN)  # type: ignore[no-untyped-call]
    return genai.Client(
        vertexai=True,
        project=project,
        location=location,
        credentials=credentials,
        http_options=types.HttpOptions(
            base_url=base,
            api_version="v1",
            timeout=TIMEOUT_MS,
            # One retry schedule: the step's (journaled, visible); the SDK's would hide tries.
            retry_options=types.HttpRetryOptions(attempts=1),
        ),
    )


def _api_failure(exc: Any) -> BlockFailure:
    code = int(getattr(exc, "code", 0) or 0)
    status = str(getattr(exc, "status", "") or "")
    message = f"Vertex AI answered {code} {status}: {getattr(exc, 'message', exc)}"
    if code == 429 or status == "RESOURCE_EXHAUSTED":
        return BlockFailure(
            message,
            error_class="transient",
            outcome_code=OUTCOME_RESOURCE_EXHAUSTED,
            not_applied=True,
        )
    if status == "INVALID_ARGUMENT" or code == 400:
        return BlockFailure(
            message,
            error_class="permanent",
            outcome_code=OUTCOME_INVALID_ARGUMENT,
            not_applied=True,
        )
    return BlockFailure(
        message,
        error_class=classify_status(code) if code else "transient",
        outcome_code=f"AI_HTTP_{code}",
        # A refusal before generation (4xx) spent nothing; a 5xx may have.
        not_applied=400 <= code < 500,
    )


def _connect_errors() -> tuple[type[BaseException], ...]:
    import httpx

    found: list[type[BaseException]] = [httpx.ConnectError]
    try:
        import httpx2  # the SDK's transport when installed

        found.append(httpx2.ConnectError)
    except ImportError:
        pass
    return tuple(found)


def _usage(response: Any) -> dict[str, int | None]:
    usage = response.usage_metadata
    return {
        "prompt_tokens": getattr(usage, "prompt_token_count", None),
        "answer_tokens": getattr(usage, "candidates_token_count", None),
        "total_tokens": getattr(usage, "total_token_count", None),
    }


def execute_generate(ctx: BlockContext, config: BaseModel) -> BlockResult:
    assert isinstance(config, AiConfig)
    if ctx.dry_run:
        answer = config.rehearsal_answer
        if answer is None:
            answer = answer_schema.example(config.answer_schema)
        return dry_run_result(
            "ai.generate",
            {"answer": answer, "model": config.model, "usage": None},
            prompt=config.prompt,
            schema=config.answer_schema,
            rehearsal_answer_declared=config.rehearsal_answer is not None,
        )
    from google.genai import errors, types

    project, location, tenant_model = _vertex(ctx)
    model = config.model or tenant_model or DEFAULT_MODEL
    generation = types.GenerateContentConfig(
        response_mime_type="application/json",
        response_json_schema=config.answer_schema,
        temperature=config.temperature,
        max_output_tokens=config.max_output_tokens,
        # No tools are declared; the SDK's function-calling loop stays off (one request).
        automatic_function_calling=types.AutomaticFunctionCallingConfig(disable=True),
    )
    request = _request_hash(model, config)
    journaled = _journaled(ctx, request)
    if journaled is not None:
        return journaled
    try:
        # Held in a `with`: a client left to the garbage collector closes its transport
        # under the call still using it.
        with _client(project, location) as client:
            response = client.models.generate_content(
                model=model, contents=config.prompt, config=generation
            )
    except errors.APIError as exc:
        raise _api_failure(exc) from exc
    except _connect_errors() as exc:
        raise BlockFailure(
            f"cannot reach Vertex AI: {exc!r}",
            error_class="transient",
            outcome_code="AI_CONNECTION_ERROR",
            not_applied=True,
        ) from exc
    usage = _usage(response)
    text = response.text or ""
    try:
        answer = json.loads(text)
    except ValueError:
        problems = [f"$: the answer is not JSON: {text[:200]!r}"]
    else:
        problems = answer_schema.violations(answer, config.answer_schema)
    if problems:
        raise BlockFailure(
            f"the model's answer breaks the schema (attempt {ctx.attempt}): "
            + "; ".join(problems[:5]),
            error_class="transient",
            outcome_code=OUTCOME_ANSWER_INVALID,
        )
    _journal(ctx, request, model=model, answer=answer, usage=usage, version=response.model_version)
    return BlockResult(
        output={
            "answer": answer,
            "model": model,
            "model_version": response.model_version,
            "usage": usage,
        }
    )


def _request_hash(model: str, config: AiConfig) -> str:
    """What makes two asks the same ask: model, rendered prompt, schema, sampling, cap."""
    request = [
        model,
        config.prompt,
        config.answer_schema,
        config.temperature,
        config.max_output_tokens,
    ]
    return hashlib.sha256(json.dumps(request, sort_keys=True).encode()).hexdigest()


def _journaled(ctx: BlockContext, request: str) -> BlockResult | None:
    """The answer an earlier attempt of this lineage key received for the same request (a
    retry after a lost lease, a replay that started the step again): reused, the model is
    not asked again (outcome `AI_ANSWER_REUSED`, `reused: true` in the output)."""
    with ctx.database().transaction() as tx:
        row = tx.one(
            ANSWER_GET,
            idempotency_key=ctx.idempotency_key,
            request_hash=request,
            tenant_id=ctx.tenant_id,
        )
    if row is None:
        return None
    return BlockResult(
        output={
            "answer": row["answer"],
            "model": row["model"],
            "model_version": row["model_version"],
            "usage": row["usage"],
            "reused": True,
            "answered_at": row["created_at"].isoformat(),
        },
        outcome_code=OUTCOME_ANSWER_REUSED,
    )


def _journal(
    ctx: BlockContext,
    request: str,
    *,
    model: str,
    answer: Any,
    usage: Mapping[str, Any],
    version: str | None,
) -> None:
    """Commit the conforming answer under the lineage key before the step settles, so an
    attempt that loses its lease (or its process) after the answer doesn't pay for it twice."""
    with ctx.database().transaction() as tx:
        tx.execute(
            ANSWER_PUT,
            idempotency_key=ctx.idempotency_key,
            tenant_id=ctx.tenant_id,
            step_id=ctx.step_id,
            request_hash=request,
            model=model,
            answer=json.dumps(answer),
            usage=json.dumps(dict(usage)),
            model_version=version,
        )


# Google: "a token is equivalent to about 4 characters" for Gemini models
# (https://docs.cloud.google.com/vertex-ai/generative-ai/docs/multimodal/get-token-count).
CHARS_PER_TOKEN = 4


def token_cap(config: BaseModel) -> int:
    """The most tokens one call may use, reserved and charged before it: the answer's cap
    plus the prompt at Google's four characters a token (an estimate, but the settle never
    charges more than this, so an underestimate costs onceflow, never the tenant's cap)."""
    assert isinstance(config, AiConfig)
    return config.max_output_tokens + -(-len(config.prompt) // CHARS_PER_TOKEN)


def tokens_used(output: Mapping[str, Any]) -> int | None:
    """`usage.total_tokens` Vertex AI reported (prompt and answer; None: not reported). A
    reused journaled answer reports the call that produced it."""
    usage = output.get("usage")
    total = usage.get("total_tokens") if isinstance(usage, Mapping) else None
    return total if isinstance(total, int) else None


GENERATE = BlockSpec(
    type_name="ai.generate",
    config_model=AiConfig,
    kind="action",
    # Asking again is harmless to the world (nothing is written), only to the bill, which the
    # charge gate keeps to one per lineage key.
    side_effect="idempotent",
    # One credit a call, plus ten per thousand tokens: reserved and charged at `token_cap`
    # before the call, settled down to `usage.total_tokens` after it.
    price=1,
    token_price=TokenPrice(per_1k_tokens=10, cap=token_cap, used=tokens_used),
    # Google's advice for 429: truncated exponential backoff, at least a second
    # (api-errors page above); the step's schedule waits longer than that.
    retry=RetryPolicy(max_attempts=3, first_backoff_seconds=30.0, max_backoff_seconds=600.0),
    execute=execute_generate,
    gates=frozenset({Gate.WORKFLOW_LIMIT, Gate.HOST_LIMIT, Gate.BUDGET, Gate.CHARGE}),
    target=vertex_target,
    description=(
        "Ask a Gemini model on Vertex AI for a JSON answer that must satisfy a schema "
        "(checked on receipt, retried within the attempts); charged once per lineage, by the "
        "tokens used."
    ),
)
SPECS = (GENERATE,)
