"""infra/ checked against the function registry (shared/core/deployables.py), offline.

`terraform validate` needs the google provider, which cannot be downloaded here; these tests
parse the HCL with python-hcl2 and check what the plan would deploy: every function with its
entry point and trigger, every push subscription with a dead-letter topic and retry policy,
every scheduled function with an OIDC job, no secret in a plain environment variable, no
public invoker but `webhook`, the connection budget, and that every reference resolves.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from devstack.bundle import parse_terraform
from shared.core.db import BACKGROUND_HOLDERS, pool_size_for
from shared.core.deployables import DEPLOYABLES, TOPICS

ROOT = Path(__file__).resolve().parent.parent
INFRA = ROOT / "infra"
SECRET_WORDS = ("SECRET", "TOKEN", "PASSWORD", "KEY", "CREDENTIAL", "PEPPER")
PUBLIC_MEMBERS = ("allUsers", "allAuthenticatedUsers")
FUNCTION_RESOURCE = "google_cloudfunctions2_function"


@dataclass
class Terraform:
    resources: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    data: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    variables: dict[str, dict[str, Any]] = field(default_factory=dict)
    locals: dict[str, Any] = field(default_factory=dict)
    outputs: dict[str, dict[str, Any]] = field(default_factory=dict)
    terraform: list[dict[str, Any]] = field(default_factory=list)

    def of_type(self, rtype: str) -> dict[str, dict[str, Any]]:
        return {name: body for (t, name), body in self.resources.items() if t == rtype}


@pytest.fixture(scope="module")
def tf() -> Terraform:
    found = Terraform()
    for path in sorted(INFRA.glob("*.tf")):
        parsed = parse_terraform(path)
        for group, target in (("resource", found.resources), ("data", found.data)):
            for block in parsed.get(group, []):
                for rtype, named in block.items():
                    for name, body in named.items():
                        assert (rtype, name) not in target, f"{rtype}.{name} declared twice"
                        target[(rtype, name)] = body
        for block in parsed.get("variable", []):
            found.variables.update(block)
        for block in parsed.get("locals", []):
            found.locals.update({k: v for k, v in block.items() if k != "__comments__"})
        for block in parsed.get("output", []):
            found.outputs.update(block)
        found.terraform.extend(parsed.get("terraform", []))
    return found


def one(blocks: Any) -> dict[str, Any]:
    """A nested block (python-hcl2 gives a list of one dict)."""
    assert isinstance(blocks, list) and len(blocks) == 1, blocks
    body = blocks[0]
    assert isinstance(body, dict)
    return body


def ref_to(rtype: str, expression: Any) -> str:
    """The resource name in `${rtype.NAME.attr}`, or fail."""
    match = re.fullmatch(rf"\$\{{{re.escape(rtype)}\.([a-z0-9_]+)\.[a-z_]+\}}", str(expression))
    assert match, f"expected a reference to a {rtype}, got {expression!r}"
    return match[1]


def function_ref(expression: Any) -> str:
    """The function key in `${google_cloudfunctions2_function.function["KEY"].attr}` (attr
    `url`, or `service_config[0].uri`, the run.app URL)."""
    match = re.fullmatch(
        rf'\$\{{{FUNCTION_RESOURCE}\.function\["([a-z_]+)"\]\.'
        r"(?:[a-z_]+|service_config\[0\]\.uri)\}",
        str(expression),
    )
    assert match, f"expected a reference to one function, got {expression!r}"
    return match[1]


def walk(value: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    yield path, value
    if isinstance(value, dict):
        for k, v in value.items():
            if k != "__comments__":  # python-hcl2 keeps comments; they are not configuration
                yield from walk(v, f"{path}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from walk(v, f"{path}[{i}]")


# --- functions ------------------------------------------------------------------------------


def test_every_deployable_has_a_function_with_its_entry_point_and_trigger(tf: Terraform) -> None:
    declared = tf.locals["functions"]
    assert set(declared) == {d.name for d in DEPLOYABLES}
    for d in DEPLOYABLES:
        entry = declared[d.name]
        assert entry["entry_point"] == d.name, d.name
        assert entry["trigger"] == d.trigger, d.name
        assert entry["public"] is d.public, d.name
        assert entry["uses_database"] is d.uses_database, d.name

    functions = tf.of_type(FUNCTION_RESOURCE)
    assert set(functions) == {"function"}, "one for_each resource over local.functions"
    fn = functions["function"]
    assert fn["for_each"] == "${local.functions}"
    build = one(fn["build_config"])
    assert build["entry_point"] == "${each.value.entry_point}"
    assert build["runtime"] == "python311"
    storage = one(one(build["source"])["storage_source"])
    assert ref_to("google_storage_bucket_object", storage["object"]) == "bundle"
    # Pub/Sub delivery is our own push subscription (pubsub.tf), never an Eventarc trigger.
    assert "event_trigger" not in fn
    service = one(fn["service_config"])
    assert service["max_instance_count"] == "${var.max_instances[each.key]}"
    assert service["vpc_connector"].startswith("${google_vpc_access_connector.")
    env = service["environment_variables"]
    for name in ("INSTANCE_CONNECTION_NAME", "DB_IAM_USER", "DB_NAME", "GOOGLE_CLOUD_PROJECT"):
        assert name in env, f"{name} missing from the functions' environment"
    assert "NO_GCE_CHECK" not in env, "the metadata server is real in the cloud"


def test_bundle_object_is_named_by_content_hash(tf: Terraform) -> None:
    patterns = tf.locals["bundle_patterns"]
    assert isinstance(patterns, list) and "main.py" in patterns and "requirements.txt" in patterns
    obj = tf.resources[("google_storage_bucket_object", "bundle")]
    assert "local.bundle_hash" in obj["name"]
    assert "local.bundle_files" in tf.locals["bundle_hash"]
    assert "local.bundle_patterns" in tf.locals["bundle_files"]
    archive = tf.data[("archive_file", "bundle")]
    assert "local.bundle_files" in one(archive["dynamic"])["source"]["for_each"]


# --- Pub/Sub --------------------------------------------------------------------------------


def test_every_pubsub_function_has_a_push_subscription_with_dead_letter_and_retry(
    tf: Terraform,
) -> None:
    topics = {body["name"]: name for name, body in tf.of_type("google_pubsub_topic").items()}
    assert set(TOPICS) <= set(topics)
    subscriptions = tf.of_type("google_pubsub_subscription")
    timeouts = {k: v["timeout_seconds"] for k, v in tf.locals["functions"].items()}
    dl_publishers = tf.resources[("google_pubsub_topic_iam_member", "dead_letter_publisher")]
    dl_subscribers = tf.resources[
        ("google_pubsub_subscription_iam_member", "dead_letter_subscriber")
    ]

    # One for_each push subscription over local.push_subscriptions, keyed by the function.
    assert [n for n, body in subscriptions.items() if "push_config" in body] == ["push"]
    sub = subscriptions["push"]
    assert sub["for_each"] == "${local.push_subscriptions}"
    own_uri = "${google_cloudfunctions2_function.function[each.key].service_config[0].uri}"
    push = one(sub["push_config"])
    oidc = one(push["oidc_token"])
    assert push["push_endpoint"] == own_uri and oidc["audience"] == own_uri
    assert ref_to("google_service_account", oidc["service_account_email"]) == "pubsub_push"
    assert sub["topic"] == "${each.value.topic}"
    assert sub["ack_deadline_seconds"] == "${each.value.ack_deadline_seconds}"
    retry = one(sub["retry_policy"])
    assert retry["minimum_backoff"].endswith("s") and retry["maximum_backoff"].endswith("s")
    assert int(retry["minimum_backoff"][:-1]) <= int(retry["maximum_backoff"][:-1]) <= 600
    dead = one(sub["dead_letter_policy"])
    assert dead["dead_letter_topic"] == "${each.value.dead_letter_topic}"
    assert 5 <= dead["max_delivery_attempts"] <= 100

    pubsub = [d for d in DEPLOYABLES if d.trigger == "pubsub"]
    assert pubsub
    assert set(tf.locals["push_subscriptions"]) == {d.name for d in pubsub}
    for d in pubsub:
        assert d.topic is not None
        entry = tf.locals["push_subscriptions"][d.name]
        assert ref_to("google_pubsub_topic", entry["topic"]) == topics[d.topic]
        assert entry["name"] == f"{d.name.replace('_', '-')}-push"
        dead_topic = ref_to("google_pubsub_topic", entry["dead_letter_topic"])
        assert tf.resources[("google_pubsub_topic", dead_topic)]["name"] == f"{d.topic}-dead-letter"
        # For push the ack deadline is the request timeout: shorter than the function's
        # timeout would redeliver a message that is still being handled.
        assert timeouts[d.name] <= entry["ack_deadline_seconds"] <= 600

        # The Pub/Sub service agent may publish to the dead-letter topic and ack the source.
        assert f"google_pubsub_topic.{dead_topic}.name" in str(dl_publishers["for_each"])
        own = f'google_pubsub_subscription.push["{d.name}"].name'
        assert own in str(dl_subscribers["for_each"])
        assert "gcp-sa-pubsub" in tf.locals["pubsub_service_agent"]


def test_a_step_lease_outlives_any_advance_step_invocation(tf: Terraform) -> None:
    from shared.steps.claim import DEFAULT_HEARTBEAT_SECONDS, DEFAULT_LEASE_SECONDS

    # A lease shorter than the function's timeout would let the sweep reclaim a step that a
    # healthy invocation is still running; heartbeats must come well inside the lease.
    timeout = tf.locals["functions"]["advance_step"]["timeout_seconds"]
    assert timeout < DEFAULT_LEASE_SECONDS
    assert DEFAULT_HEARTBEAT_SECONDS * 5 <= DEFAULT_LEASE_SECONDS
    # The entry point's docstring states the deployed timeout; it must not drift (it said 540).
    entry = (ROOT / "functions" / "advance_step.py").read_text()
    assert f"Deployed with a {timeout} s timeout" in entry


def test_pubsub_functions_are_invokable_by_the_push_identity_only(tf: Terraform) -> None:
    invoker = tf.resources[("google_cloud_run_service_iam_member", "pubsub_push_invoker")]
    assert invoker["for_each"] == "${local.pubsub_functions}"
    assert 'f.trigger == "pubsub"' in tf.locals["pubsub_functions"]
    assert ref_to("google_service_account", invoker["member"]) == "pubsub_push"


# --- scheduler ------------------------------------------------------------------------------


def test_every_scheduled_function_has_a_job_with_oidc(tf: Terraform) -> None:
    # One for_each job over local.scheduled_functions, keyed by the function it calls.
    assert set(tf.of_type("google_cloud_scheduler_job")) == {"function"}
    job = tf.resources[("google_cloud_scheduler_job", "function")]
    assert job["for_each"] == "${local.scheduled_functions}"
    scheduled = {d.name for d in DEPLOYABLES if d.trigger == "schedule"}
    assert set(tf.locals["scheduled_functions"]) == scheduled, "one job per scheduled function"
    for entry in tf.locals["scheduled_functions"].values():
        # devstack's local scheduler reads this literal; an expression would break it.
        assert re.fullmatch(r"[\d*/,-]+( [\d*/,-]+){4}", entry["schedule"]), entry["schedule"]
    assert job["schedule"] == "${each.value.schedule}"
    target = one(job["http_target"])
    own_uri = "${google_cloudfunctions2_function.function[each.key].service_config[0].uri}"
    assert target["uri"] == own_uri
    oidc = one(target["oidc_token"])
    assert ref_to("google_service_account", oidc["service_account_email"]) == "scheduler"
    assert oidc["audience"] == own_uri
    invoker = tf.resources[("google_cloud_run_service_iam_member", "scheduler_invoker")]
    assert ref_to("google_service_account", invoker["member"]) == "scheduler"


# --- secrets and IAM ------------------------------------------------------------------------


def test_no_secret_in_a_plain_environment_variable(tf: Terraform) -> None:
    checked = 0
    for (rtype, name), body in tf.resources.items():
        for path, value in walk(body):
            if path.endswith(".environment_variables") and isinstance(value, dict):
                for key in value:
                    checked += 1
                    assert not any(w in key.upper() for w in SECRET_WORDS), (
                        f"{rtype}.{name}{path}: {key} looks secret; use "
                        "secret_environment_variables"
                    )
    assert checked >= 5

    service = one(tf.resources[(FUNCTION_RESOURCE, "function")]["service_config"])
    dynamic = one(service["dynamic"])["secret_environment_variables"]
    assert "local.secrets" in dynamic["for_each"]
    assert "var.secrets" in tf.locals["secrets"]
    content = one(dynamic["content"])
    assert "var" not in str(content.get("value", "")), "secrets arrive by reference only"
    assert content["version"] == "${secret_environment_variables.value.version}"

    secrets = tf.variables["secrets"]
    for secret_id, spec in secrets["default"].items():
        assert re.fullmatch(r"[1-9]\d*", spec["version"]), f"{secret_id}: pin a version"
        assert set(spec["functions"]) <= {d.name for d in DEPLOYABLES}
    validations = " ".join(str(v["condition"]) for v in secrets["validation"])
    assert "regex" in validations and "version" in validations, "versions must stay pinned"


def test_no_public_invoker_except_webhook(tf: Terraform) -> None:
    public = []
    for (rtype, name), body in tf.resources.items():
        for path, value in walk(body):
            if isinstance(value, str) and any(m in value for m in PUBLIC_MEMBERS):
                public.append((rtype, name, path))
    assert public == [("google_cloud_run_service_iam_member", "webhook_public", ".member")]
    grant = tf.resources[("google_cloud_run_service_iam_member", "webhook_public")]
    assert grant["role"] == "roles/run.invoker"
    assert function_ref(grant["service"]) == "webhook"
    assert [d.name for d in DEPLOYABLES if d.public] == ["webhook"]

    ops_invokers = tf.variables["ops_invokers"]
    assert "allUsers" in str(ops_invokers["validation"]), "ops_invokers must refuse allUsers"


def test_each_function_runs_as_its_own_service_account(tf: Terraform) -> None:
    accounts = tf.resources[("google_service_account", "function")]
    assert accounts["for_each"] == "${local.functions}"
    service = one(tf.resources[(FUNCTION_RESOURCE, "function")]["service_config"])
    assert service["service_account_email"] == "${google_service_account.function[each.key].email}"
    assert "each.key" in accounts["account_id"]


# --- database -------------------------------------------------------------------------------


def test_cloud_sql_is_private_with_iam_auth(tf: Terraform) -> None:
    instance = tf.resources[("google_sql_database_instance", "main")]
    settings = one(instance["settings"])
    ip = one(settings["ip_configuration"])
    assert ip["ipv4_enabled"] is False
    flags = {f["name"]: f["value"] for f in settings["database_flags"]}
    assert flags["cloudsql.iam_authentication"] == "on"
    assert "var.db_max_connections" in flags["max_connections"]
    users = tf.resources[("google_sql_user", "function")]
    assert users["type"] == "CLOUD_IAM_SERVICE_ACCOUNT"


def test_connection_budget_check_fails_the_plan_and_holds_for_the_defaults(tf: Terraform) -> None:
    budget = tf.resources[("terraform_data", "db_connection_budget")]
    conditions = [p["condition"] for p in one(budget["lifecycle"])["precondition"]]
    assert "${local.db_connection_demand < local.db_connection_limit}" in conditions
    demand = tf.locals["db_connection_demand"]
    for name in ("var.max_instances", "local.db_pool_size[name]", "f.uses_database"):
        assert name in demand
    limit = tf.locals["db_connection_limit"]
    assert "var.db_max_connections" in limit and "var.db_connection_reserve" in limit

    defaults = {k: v.get("default") for k, v in tf.variables.items()}
    max_instances = defaults["max_instances"]
    assert set(max_instances) == {d.name for d in DEPLOYABLES}
    concurrency = defaults["request_concurrency"]
    # Every instance fills the pool its concurrency needs (shared/core/db.py pool_size_for).
    used = sum(
        max_instances[d.name] * pool_size_for(concurrency[d.name])
        for d in DEPLOYABLES
        if d.uses_database
    )
    assert used < defaults["db_max_connections"] - defaults["db_connection_reserve"]


def test_each_function_serves_its_concurrency_with_a_pool_that_fits_it(tf: Terraform) -> None:
    """Cloud Run sends an instance as many requests as `request_concurrency`, gunicorn has as
    many threads, and the pool one connection more than that (pool_size_for): the defaults are
    the registry's, and the pool is derived by the same rule as shared/core/db.py's."""
    defaults = tf.variables["request_concurrency"]["default"]
    assert defaults == {d.name: d.concurrency for d in DEPLOYABLES}
    # The scheduled functions stay at one request: one tick a minute, one pass at a time.
    assert {d.name for d in DEPLOYABLES if d.trigger == "schedule" and d.concurrency != 1} == set()
    assert {d.name for d in DEPLOYABLES if d.concurrency > 1} == {
        "webhook",
        "admit_event",
        "advance_step",
        "ops",
    }
    pool = tf.locals["db_pool_size"]
    assert "var.request_concurrency" in pool and f"+ {BACKGROUND_HOLDERS}" in pool
    assert all(pool_size_for(d.concurrency) == d.pool_size for d in DEPLOYABLES)

    service = one(tf.resources[(FUNCTION_RESOURCE, "function")]["service_config"])
    assert service["max_instance_request_concurrency"] == "${var.request_concurrency[each.key]}"
    env = service["environment_variables"]
    assert env["THREADS"] == "${tostring(var.request_concurrency[each.key])}"
    assert env["DB_POOL_SIZE"] == "${tostring(local.db_pool_size[each.key])}"
    budget = tf.resources[("terraform_data", "db_connection_budget")]
    conditions = [p["condition"] for p in one(budget["lifecycle"])["precondition"]]
    assert any("var.request_concurrency" in c for c in conditions), "every function needs one"


# --- the files as a whole -------------------------------------------------------------------

_REFERENCE = re.compile(
    r"(?<![\w.\"])(var|local|data\.[a-z0-9_]+|google_[a-z0-9_]+|terraform_data)\.([a-z0-9_]+)"
)


def test_every_reference_resolves(tf: Terraform) -> None:
    """The part of `terraform validate` that needs no provider: names that exist."""
    bodies: list[Any] = [tf.locals, tf.outputs, *tf.resources.values(), *tf.data.values()]
    missing = set()
    for body in bodies:
        for _, value in walk(body):
            if not isinstance(value, str) or "${" not in value:
                continue
            for kind, name in _REFERENCE.findall(value):
                if kind == "var":
                    ok = name in tf.variables
                elif kind == "local":
                    ok = name in tf.locals
                elif kind.startswith("data."):
                    ok = (kind.removeprefix("data."), name) in tf.data
                else:
                    ok = (kind, name) in tf.resources
                if not ok:
                    missing.add(f"{kind}.{name}")
    assert not missing, f"undeclared references: {sorted(missing)}"


def test_versions_pin_the_providers(tf: Terraform) -> None:
    required = one(tf.terraform[0]["required_providers"])
    assert required["google"]["source"] == "hashicorp/google"
    assert required["google"]["version"].startswith("~> 6.")
    assert required["archive"]["source"] == "hashicorp/archive"
    files = {p.name for p in INFRA.glob("*.tf")}
    expected = {"versions.tf", "variables.tf", "outputs.tf", "functions.tf", "pubsub.tf"}
    expected |= {"scheduler.tf", "sql.tf", "secrets.tf", "iam.tf", "network.tf", "bundle.tf"}
    assert expected <= files


def test_terraform_fmt_is_clean() -> None:
    terraform = shutil.which("terraform")
    if terraform is None:
        pytest.skip("terraform is not installed, so `terraform fmt -check` cannot run")
    out = subprocess.run(
        [terraform, "fmt", "-check", "-recursive", "-no-color", str(INFRA)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, f"terraform fmt would change: {out.stdout}"


# --- cloudbuild.yaml ------------------------------------------------------------------------


def test_cloudbuild_tests_migrates_packages_and_applies_infra() -> None:
    build = yaml.safe_load((ROOT / "cloudbuild.yaml").read_text("utf-8"))
    steps = build["steps"]

    def text(step: dict[str, Any]) -> str:
        # The command a step runs: its entrypoint, or the image's own (hashicorp/terraform).
        program = step.get("entrypoint") or step["name"].split("/")[-1].split(":")[0]
        words = [program, *map(str, step.get("args", []))]
        if "script" in step:
            words.append(str(step["script"]))
        return " ".join(words)

    def index(needle: str) -> int:
        found = [i for i, s in enumerate(steps) if needle in text(s)]
        assert found, f"no cloudbuild step runs `{needle}`"
        return found[0]

    readme_test_command = "make test"
    assert readme_test_command in (ROOT / ".ci/run").read_text("utf-8")
    test, migrate = index(readme_test_command), index("shared.core.migrate")
    package = index("devstack.bundle")
    init, plan, apply = index("terraform init"), index("terraform plan"), index("terraform apply")
    assert test < migrate < apply and test < package and init < plan < apply
    for i in (init, plan, apply):
        assert steps[i].get("dir") == "infra", "terraform runs in infra/"
    assert "-var=project_id=${_PROJECT}" in text(steps[plan])
    assert "-var=region=${_REGION}" in text(steps[plan])
    # apply runs the reviewed plan file, which carries those variables.
    assert "-out=tfplan" in text(steps[plan]) and text(steps[apply]).endswith(" tfplan")
    subs = build["substitutions"]
    assert {"_PROJECT", "_REGION"} <= set(subs)


def test_the_pipeline_plans_what_the_committed_deployment_declares(tf: Terraform) -> None:
    """A build can't delete what a deploy declared: the plan passes only the values its
    substitutions bind, every other choice comes from the committed *.auto.tfvars (which
    Terraform reads by itself), and that file sets only declared variables and none of the
    substitution-bound ones (a -var would silently override it)."""
    build = yaml.safe_load((ROOT / "cloudbuild.yaml").read_text("utf-8"))
    (plan,) = [s for s in build["steps"] if s.get("args", [None])[0] == "plan"]
    passed = {
        a.removeprefix("-var=").split("=", 1)[0]: a.split("=", 2)[2]
        for a in plan["args"]
        if a.startswith("-var=")
    }
    assert all(re.fullmatch(r"\$\{_[A-Z_]+\}", v) for v in passed.values()), passed
    assert not [a for a in plan["args"] if a.startswith("-var-file")], "tfvars are auto-loaded"
    committed = sorted(INFRA.glob("*.auto.tfvars"))
    assert [p.name for p in committed] == ["deployment.auto.tfvars"]
    examples = re.findall(r"^#\s*([a-z_]+)\s*=", committed[0].read_text("utf-8"), re.M)
    assert examples and set(examples) <= set(tf.variables), examples
    declared = {k for k in parse_terraform(committed[0]) if not k.startswith("__")}
    assert declared <= set(tf.variables)
    assert not set(declared) & set(passed)


# --- infra/grants.sql -----------------------------------------------------------------------


def test_bootstrap_then_grants_work_for_a_deployer_without_createrole(
    empty_database_url: str,
) -> None:
    """The order infra/README.md prescribes, on an empty database: `postgres` runs
    bootstrap.sql once; the deployer, an ordinary login role WITHOUT CREATEROLE (as a Cloud
    SQL IAM user is), applies the migrations (so it owns the schema) and runs grants.sql
    twice (the second deploy must be a no-op). Function users then have the app role; others
    don't."""
    import uuid

    import pg8000.dbapi

    from shared.core.db import parse_database_url
    from shared.core.migrate import apply_all, discover

    tag = uuid.uuid4().hex[:8]
    deployer = f"onceflow-deployer-{tag}@p.iam"
    member = f"onceflow-fn-test-{tag}@p.iam"
    outsider = f"someone-{tag}@p.iam"
    params = parse_database_url(empty_database_url)
    admin = pg8000.dbapi.connect(**params)
    admin.autocommit = True
    cur = admin.cursor()
    try:
        for role in (deployer, member, outsider):
            cur.execute(f'CREATE ROLE "{role}" LOGIN NOSUPERUSER NOCREATEROLE')
        as_deployer = pg8000.dbapi.connect(**{**params, "user": deployer})
        try:
            # Before the bootstrap, grants.sql says what is missing instead of failing obscurely.
            with pytest.raises(pg8000.dbapi.DatabaseError, match="cannot grant onceflow_app"):
                as_deployer.autocommit = True
                as_deployer.cursor().execute((INFRA / "grants.sql").read_text("utf-8"))
            bootstrap = (INFRA / "bootstrap.sql").read_text("utf-8")
            cur.execute(f"SET onceflow.deployer = '{deployer}'")
            cur.execute(bootstrap)
            cur.execute(bootstrap)
            apply_all(as_deployer, discover(), log=False)
            grants = (INFRA / "grants.sql").read_text("utf-8")
            as_deployer.autocommit = True
            as_deployer.cursor().execute(grants)
            as_deployer.cursor().execute(grants)
        finally:
            as_deployer.close()
        cur.execute("SELECT rolcreaterole FROM pg_roles WHERE rolname = %s", (deployer,))
        assert cur.fetchone()[0] is False
        cur.execute("SELECT tableowner FROM pg_tables WHERE tablename = 'workflow_steps'")
        assert cur.fetchone()[0] == deployer, "the deployer owns the schema it migrated"
        cur.execute("SELECT has_table_privilege(%s, 'workflow_steps', 'INSERT, UPDATE')", (member,))
        assert cur.fetchone()[0] is True
        cur.execute("SELECT has_table_privilege(%s, 'workflow_steps', 'SELECT')", (outsider,))
        assert cur.fetchone()[0] is False, "only onceflow-fn-* users get the app role"
    finally:
        cur.execute("SELECT 1 FROM pg_roles WHERE rolname = 'onceflow_app'")
        if cur.fetchone():
            cur.execute("DROP OWNED BY onceflow_app")
        for role in (member, outsider, deployer):
            cur.execute(f'DROP OWNED BY "{role}"')
            cur.execute(f'DROP ROLE IF EXISTS "{role}"')
        admin.close()


# --- issue 18: deploys that work the first time and say when something is stuck ------------


def test_every_subscription_never_expires_or_says_why(tf: Terraform) -> None:
    """Without expiration_policy Pub/Sub deletes a subscription after 31 idle days: for a
    dead-letter hold that is its normal state, and later dead letters would be lost."""
    allowed = tf.locals["subscriptions_allowed_to_expire"]
    subscriptions = tf.of_type("google_pubsub_subscription")
    assert len(subscriptions) >= 3  # the two dead-letter holds and the push for_each
    for name, sub in subscriptions.items():
        if name in allowed:
            assert isinstance(allowed[name], str) and len(allowed[name]) > 20, name
            continue
        assert "expiration_policy" in sub, f"{name}: no expiration_policy (expires after 31 days)"
        assert one(sub["expiration_policy"])["ttl"] == "", f'{name}: ttl must be "" (never)'
    holds = [s for s in subscriptions.values() if s["name"].endswith("-dead-letter-hold")]
    assert len(holds) == 2 and not set(allowed) & {
        n for n, s in subscriptions.items() if s in holds
    }, "the dead-letter holds themselves may never expire"


def test_functions_declare_log_execution_id_so_plans_show_no_diff(tf: Terraform) -> None:
    service = one(tf.resources[(FUNCTION_RESOURCE, "function")]["service_config"])
    assert service["environment_variables"]["LOG_EXECUTION_ID"] == "true"


def test_functions_are_sized_for_python(tf: Terraform) -> None:
    fn = tf.resources[(FUNCTION_RESOURCE, "function")]
    service = one(fn["service_config"])
    assert service["available_cpu"] == "${each.value.cpu}"
    for name, entry in tf.locals["functions"].items():
        # A fraction of a vCPU makes a Python cold start take seconds.
        assert float(entry["cpu"]) >= 1, name
    # webhook may keep warm instances, set by a variable; by default every function scales to
    # zero (a cold webhook is well inside the CRM's delivery timeout: infra/README.md).
    assert "var.webhook_min_instances" in service["min_instance_count"]
    assert 'each.key == "webhook"' in service["min_instance_count"]
    assert tf.variables["webhook_min_instances"]["default"] == 0
    # Builds run as their own account, with the roles a build needs and nothing more.
    build = one(fn["build_config"])
    assert ref_to("google_service_account", build["service_account"]) == "build"
    roles = tf.resources[("google_project_iam_member", "build")]
    assert ref_to("google_service_account", roles["member"]) == "build"
    assert "roles/artifactregistry.writer" in str(roles["for_each"])
    assert "roles/logging.logWriter" in str(roles["for_each"])
    assert "google_project_iam_member.build" in str(fn["depends_on"])


def test_internal_only_ingress_for_functions_no_outsider_calls(tf: Terraform) -> None:
    """Pub/Sub push and Cloud Scheduler of the same project count as internal traffic for
    Cloud Run (functions.tf, infra/README.md "Ingress"); webhook and ops are called from the
    internet (the CRM, people) and stay ALLOW_ALL behind signatures and IAM."""
    service = one(tf.resources[(FUNCTION_RESOURCE, "function")]["service_config"])
    assert service["ingress_settings"] == "${each.value.ingress}"
    declared = tf.locals["functions"]
    for d in DEPLOYABLES:
        expected = "ALLOW_INTERNAL_ONLY" if d.trigger in ("pubsub", "schedule") else "ALLOW_ALL"
        assert declared[d.name]["ingress"] == expected, d.name
    internal = [n for n, f in declared.items() if f["ingress"] == "ALLOW_INTERNAL_ONLY"]
    assert len(internal) == 5
    source = (INFRA / "functions.tf").read_text("utf-8")
    assert "so ingress stays ALLOW_ALL" not in source, "the old, wrong comment is back"


def test_everything_labelled_and_old_bundles_expire(tf: Terraform) -> None:
    assert "var.labels" in tf.locals["labels"]
    labelled = {
        (FUNCTION_RESOURCE, "function"): "labels",
        ("google_storage_bucket", "source"): "labels",
        ("google_secret_manager_secret", "secret"): "labels",
    }
    for rtype in ("google_pubsub_topic", "google_pubsub_subscription"):
        labelled.update({(rtype, n): "labels" for n in tf.of_type(rtype)})
    for key, attr in labelled.items():
        assert tf.resources[key][attr] == "${local.labels}", key
    sql = one(tf.resources[("google_sql_database_instance", "main")]["settings"])
    assert sql["user_labels"] == "${local.labels}"

    bucket = tf.resources[("google_storage_bucket", "source")]
    rule = one(bucket["lifecycle_rule"])
    assert one(rule["action"])["type"] == "Delete"
    condition = one(rule["condition"])
    assert condition["age"] == "${var.source_retention_days}"
    assert "onceflow-" in condition["matches_prefix"]
    assert tf.variables["source_retention_days"]["default"] >= 30


def test_apis_an_empty_project_needs_are_enabled(tf: Terraform) -> None:
    apis = set(tf.locals["apis"])
    # Project IAM bindings fail on a new project without Cloud Resource Manager.
    assert "cloudresourcemanager.googleapis.com" in apis
    assert {"logging.googleapis.com", "monitoring.googleapis.com"} <= apis
    assert {"cloudscheduler.googleapis.com", "secretmanager.googleapis.com"} <= apis


def test_every_alert_metric_matches_a_documented_log_event(tf: Terraform) -> None:
    from shared.core.logs import EVENTS, LogEvent

    counted = tf.locals["counted_events"]
    assert set(counted) == {
        str(LogEvent.RUN_FAILED),
        str(LogEvent.BREAKER_TRIPPED),
        str(LogEvent.DEAD_LETTERED),
        str(LogEvent.LEASE_EXPIRED),
    }
    metric = tf.resources[("google_logging_metric", "event_count")]
    assert metric["for_each"] == "${local.counted_events}"
    assert 'jsonPayload.event="${each.key}"' in metric["filter"]

    ages = tf.locals["backlog_ages"]
    assert {a["field"] for a in ages.values()} == set(EVENTS[LogEvent.BACKLOG_AGE])
    age_metric = tf.resources[("google_logging_metric", "backlog_age")]
    assert f'jsonPayload.event="{LogEvent.BACKLOG_AGE}"' in age_metric["filter"]
    assert age_metric["value_extractor"] == "EXTRACT(jsonPayload.${each.value.field})"
    assert one(age_metric["metric_descriptor"])["value_type"] == "DISTRIBUTION"


def test_alerts_take_thresholds_and_channels_from_variables(tf: Terraform) -> None:
    policies = tf.of_type("google_monitoring_alert_policy")
    assert set(policies) == {"event_count", "backlog_age", "pubsub_dead_letters"}
    for name, policy in policies.items():
        assert policy["notification_channels"] == "${var.notification_channels}", name
        assert one(policy["documentation"])["content"], f"{name}: say what to do"
        conditions = policy["conditions"]
        thresholds = [c["condition_threshold"] for c in conditions if "condition_threshold" in c]
        assert thresholds, name
        for t in thresholds:
            value = str(one(t)["threshold_value"])
            assert "var.alert_thresholds" in value or "each.value.threshold" in value, name
    for entries in (tf.locals["counted_events"], tf.locals["backlog_ages"]):
        for key, entry in entries.items():
            assert "var.alert_thresholds." in entry["threshold"], key
    # The sweep going silent must page too: no report means no age alert could fire.
    absent = [c for c in policies["backlog_age"]["conditions"] if "condition_absent" in c]
    assert absent
    # Pub/Sub's own dead letters: the holds' backlog.
    dl = one(one(policies["pubsub_dead_letters"]["conditions"])["condition_threshold"])
    assert "num_undelivered_messages" in dl["filter"]
    for hold in ("trigger_events_dead_letter", "step_ready_dead_letter"):
        assert f"google_pubsub_subscription.{hold}.name" in dl["filter"]
    thresholds_type = tf.variables["alert_thresholds"]["type"]
    for name in ("failed_runs", "breaker_trips", "dead_letters", "lease_expiries"):
        assert name in thresholds_type
    assert tf.variables["notification_channels"]["default"] == []


def test_ops_can_read_the_scheduler_for_the_health_view(tf: Terraform) -> None:
    grant = tf.resources[("google_project_iam_member", "ops_scheduler_viewer")]
    assert grant["role"] == "roles/cloudscheduler.viewer"
    assert grant["member"] == '${google_service_account.function["ops"].member}'
    service = one(tf.resources[(FUNCTION_RESOURCE, "function")]["service_config"])
    assert service["environment_variables"]["SCHEDULER_LOCATION"] == "${var.region}"


def test_webhook_knows_the_public_url_the_crm_signs(tf: Terraform) -> None:
    """Behind cloudfunctions.net the path loses its /webhook prefix; without PUBLIC_BASE_URL
    the rebuilt URI differs from the signed one and every signed delivery is a 401."""
    service = one(tf.resources[(FUNCTION_RESOURCE, "function")]["service_config"])
    env = service["environment_variables"]["PUBLIC_BASE_URL"]
    assert 'each.key == "webhook"' in env and "local.webhook_public_base_url" in env
    base = tf.locals["webhook_public_base_url"]
    assert "var.webhook_public_base_url" in base
    assert "https://${var.region}-${var.project_id}.cloudfunctions.net/webhook" in base
    assert "local.webhook_public_base_url" in tf.outputs["webhook_url"]["value"]


def test_internal_only_functions_are_called_at_their_run_app_url(tf: Terraform) -> None:
    """Cloud Run admits Pub/Sub and Cloud Scheduler as internal traffic only when they call the
    default run.app URL (service_config[0].uri), not the cloudfunctions.net `url`."""
    internal = {n for n, f in tf.locals["functions"].items() if f["ingress"] != "ALLOW_ALL"}
    run_app = re.compile(
        r'\$\{google_cloudfunctions2_function\.function\["([a-z_]+)"\]'
        r"\.service_config\[0\]\.uri\}"
    )
    called: set[str] = set()
    sub = tf.resources[("google_pubsub_subscription", "push")]
    push = one(sub["push_config"])
    for value in (push["push_endpoint"], one(push["oidc_token"])["audience"]):
        # The subscriptions' for_each keys are the functions they push to.
        assert run_app.fullmatch(value.replace("[each.key]", '["each"]')), value
    called |= set(tf.locals["push_subscriptions"])
    job = tf.resources[("google_cloud_scheduler_job", "function")]
    target = one(job["http_target"])
    for value in (target["uri"], one(target["oidc_token"])["audience"]):
        # The jobs' for_each keys are the functions they call.
        assert run_app.fullmatch(value.replace("[each.key]", '["each"]')), value
    called |= set(tf.locals["scheduled_functions"])
    assert called == internal


# --- infra/README.md: the procedure itself ----------------------------------------------------


def _readme_section(title: str) -> str:
    text = (INFRA / "README.md").read_text("utf-8")
    start = text.index(f"### {title}")
    end = text.find("\n### ", start + 4)
    return text[start : end if end != -1 else len(text)]


def test_readme_walks_an_empty_project_in_an_order_that_works() -> None:
    """Each step of the first deployment needs only what the steps before it made."""
    steps = _readme_section("First deployment")
    order = [
        "cloudresourcemanager.googleapis.com",  # project IAM bindings need it
        "terraform init",
        "-target=google_project_service.enabled",  # APIs before resources that use them
        "-target=google_secret_manager_secret.secret",  # containers before versions
        "gcloud secrets versions add",  # version 1 exists before a function pins it
        "terraform apply -var=project_id=P -var=region=R`",  # the whole thing
        "infra/bootstrap.sql",  # the role and the schema grant, as postgres
        "Cloud Build trigger",  # migrate (as the deployer) then apply then grants
    ]
    positions = [steps.find(marker) for marker in order]
    assert all(p >= 0 for p in positions), dict(zip(order, positions, strict=True))
    assert positions == sorted(positions), "steps out of order"
    # The role grant is spelled out, not hidden behind a file name.
    assert 'GRANT onceflow_app TO "onceflow-deployer@P.iam" WITH ADMIN OPTION' in steps
    roles = _readme_section("Who does what")
    assert "Who applies Terraform" in roles and "Who owns the schema" in roles
    assert "Verify with one signed test webhook" in (INFRA / "README.md").read_text("utf-8")
    assert "Capacity, on paper" in (INFRA / "README.md").read_text("utf-8")


def test_readme_smoke_recipe_is_accepted_by_the_real_webhook(
    db: Any, ops_server: str, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    """The README's smoke recipe without SQL: its `onceflow` lines, run as written against the
    real ops API (the bootstrap secret on stdin, as the pipe gives it), mint an admin token and
    create the tenant and connection; a delivery signed exactly as its shell recipe signs it is
    stored (200) by the real webhook entry point behind a front end that strips /webhook."""
    import base64
    import hashlib
    import hmac
    import io
    import shlex
    import time

    import functions_framework

    from shared.ops import cli
    from shared.ops.auth import BOOTSTRAP_SECRET_ENV, authenticate

    section = _readme_section("Verify with one signed test webhook")
    assert "```sql" not in section, "the smoke recipe needs no database session"
    body = re.search(r"^BODY='(.*)'$", section, re.M)
    assert body
    assert 'printf %s "POST${URI}${BODY}${TS}"' in section  # the signed base, as below
    commands = [
        line.split("| onceflow ", 1)[1] if "| onceflow " in line else line.split("onceflow ", 1)[1]
        for line in section.splitlines()
        if re.match(r"^(export \w+=\$\(.*\| )?onceflow ", line)
    ]
    assert [c.split()[0] for c in commands] == ["bootstrap", "tenants", "connections"]
    secret = "b" * 40
    monkeypatch.setenv(BOOTSTRAP_SECRET_ENV, secret)
    monkeypatch.setenv("ONCEFLOW_OPS_URL", ops_server)
    monkeypatch.delenv("ONCEFLOW_OPS_TOKEN", raising=False)
    monkeypatch.delenv("ONCEFLOW_ID_TOKEN", raising=False)
    connection = None
    for command in commands:
        argv = shlex.split(command.rstrip(")"))
        if argv[0] == "bootstrap":
            monkeypatch.setattr("sys.stdin", io.StringIO(secret + "\n"))
        assert cli.main(argv) == 0, capsys.readouterr().err
        out = capsys.readouterr().out
        if argv[0] == "bootstrap":
            token = out.strip()
            principal = authenticate(db, token)
            assert principal is not None and principal.is_admin
            monkeypatch.setenv("ONCEFLOW_OPS_TOKEN", token)
        found = re.search(r"^connection ([0-9a-f-]{36}): hubspot account 123 for tenant smoke", out)
        if found:
            connection = found[1]
    assert connection

    client_secret = "smoke-client-secret"
    base = "https://europe-west1-p.cloudfunctions.net/webhook"  # terraform output webhook_url
    monkeypatch.setenv("HUBSPOT_CLIENT_SECRET", client_secret)
    monkeypatch.setenv("PUBLIC_BASE_URL", base)
    monkeypatch.setenv("WEBHOOK_NUDGE", "off")
    uri = f"{base}/hubspot/{connection}"
    stamp = str(int(time.time()) * 1000)
    digest = hmac.new(
        client_secret.encode(), f"POST{uri}{body[1]}{stamp}".encode(), hashlib.sha256
    ).digest()
    app = functions_framework.create_app("webhook", str(ROOT / "main.py"), "http")
    response = app.test_client().post(
        f"/hubspot/{connection}",  # what the function sees: no /webhook prefix
        data=body[1].encode(),
        headers={
            "Content-Type": "application/json",
            "X-HubSpot-Request-Timestamp": stamp,
            "X-HubSpot-Signature-v3": base64.b64encode(digest).decode(),
        },
        base_url="http://10.0.0.7:8080",
    )
    assert response.status_code == 200, response.get_data(as_text=True)
    with db.transaction() as tx:
        assert (
            tx.scalar("SELECT count(*) FROM webhook_inbox WHERE connection_id = :c", c=connection)
            == 1
        )


# --- issue 13: HubSpot apps' secrets and URLs -------------------------------------------------

SAMPLE_APPS: dict[str, dict[str, Any]] = {
    "1234567": {
        "kind": "public",
        "versions": {"client_secret": "3", "client_id": "1", "developer_key": "2"},
    },
    "7654321": {"kind": "private", "versions": {"client_secret": "1"}},
}


def _fill(template: str, app_id: str, name: str) -> str:
    """A string template of secrets.tf's app loop, for one app and secret name."""
    filled = (
        template.replace("${app_id}", app_id)
        .replace('${replace(name, "_", "-")}', name.replace("_", "-"))
        .replace("${upper(name)}", name.upper())
    )
    assert "${" not in filled, f"an interpolation this test does not know: {template}"
    return filled


def deployed_secrets(tf: Terraform, apps: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """local.secrets as Terraform would compute it for `var.hubspot_apps = apps`: the fixed
    var.secrets and, per app, one secret per name its kind has, read by the functions
    local.hubspot_app_secret_readers lists. The loop's shape is asserted, its templates
    filled from the HCL itself."""
    assert tf.locals["secrets"] == "${merge(var.secrets, local.hubspot_app_secrets)}"
    loop = tf.locals["hubspot_app_secrets"]
    assert "for app_id, app in var.hubspot_apps" in loop
    assert "for name, readers in local.hubspot_app_secret_readers[app.kind]" in loop
    assert "version = app.versions[name]" in loop and "functions = readers" in loop
    key = re.search(r'"([^"]*\$\{app_id\}[^"]*(?:"_", "-"\)\}[^"]*)?)" =>', loop)
    env = re.search(r'env_var = "([^"]*)"', loop)
    assert key and env, loop
    readers = tf.locals["hubspot_app_secret_readers"]
    found = dict(tf.variables["secrets"]["default"])
    for app_id, app in apps.items():
        for name, functions in readers[app["kind"]].items():
            secret_id = _fill(key[1], app_id, name)
            assert secret_id not in found, f"{secret_id} declared twice"
            found[secret_id] = {
                "env_var": _fill(env[1], app_id, name),
                "version": app["versions"][name],
                "functions": functions,
            }
    return found


def env_of_each_function(tf: Terraform, secrets: dict[str, dict[str, Any]]) -> dict[str, set[str]]:
    """Per function, the secret variables the dynamic block hands it; checks that the
    accessor grants follow the same list (a variable without its grant fails at start-up, a
    grant without its variable is privilege nobody uses)."""
    service = one(tf.resources[(FUNCTION_RESOURCE, "function")]["service_config"])
    dynamic = one(service["dynamic"])["secret_environment_variables"]
    assert dynamic["for_each"] == (
        "${{for id, s in local.secrets : id => s if contains(s.functions, each.key)}}"
    )
    assert one(dynamic["content"])["key"] == "${secret_environment_variables.value.env_var}"
    grants = tf.locals["secret_grants"]
    assert "for id, s in local.secrets" in grants and "for fn in s.functions" in grants
    accessor = tf.resources[("google_secret_manager_secret_iam_member", "accessor")]
    assert accessor["for_each"] == "${local.secret_grants}"
    assert accessor["role"] == "roles/secretmanager.secretAccessor"
    assert accessor["member"] == "${google_service_account.function[each.value.function].member}"
    assert tf.resources[("google_secret_manager_secret", "secret")]["for_each"] == (
        "${local.secrets}"
    )
    env: dict[str, set[str]] = {d.name: set() for d in DEPLOYABLES}
    for spec in secrets.values():
        for fn in spec["functions"]:
            env[fn].add(spec["env_var"])
    return env


def test_every_app_secret_the_code_reads_reaches_its_readers_and_no_other(tf: Terraform) -> None:
    """For a public and a private app, each function gets exactly the app secrets the code
    says it reads (shared/accounts/provider_apps.py), under the names the code looks up, and the
    token-encryption key reaches exactly the functions that seal or refresh a grant (webhook at
    an install's callback, and the functions that use a connection's token)."""
    from shared.accounts.oauth_tokens import TOKEN_KEK_ENV
    from shared.accounts.provider_apps import APP_SECRET_READERS
    from shared.core.deployables import CRM_TOKEN_USERS, OAUTH_CLIENT_USERS
    from shared.providers.hubspot.apps import secret_env

    readers = tf.locals["hubspot_app_secret_readers"]
    assert {k: {n: tuple(f) for n, f in v.items()} for k, v in readers.items()} == {
        k: dict(v) for k, v in APP_SECRET_READERS.items()
    }
    env = env_of_each_function(tf, deployed_secrets(tf, SAMPLE_APPS))
    wired = 0
    for app_id, app in SAMPLE_APPS.items():
        for name in ("client_secret", "client_id", "developer_key"):
            expected = APP_SECRET_READERS[app["kind"]].get(name, ())  # type: ignore[call-overload]
            for d in DEPLOYABLES:
                has = secret_env(app_id, name) in env[d.name]  # type: ignore[arg-type]
                assert has is (d.name in expected), (app_id, name, d.name)
                wired += has
    assert wired == 4 + 4 + 2 + 1
    # The install callback is served by webhook: it exchanges the code with the app's client
    # and seals the grant, so it reads both halves of the client and the key.
    assert "webhook" in APP_SECRET_READERS["public"]["client_id"]
    assert "webhook" in APP_SECRET_READERS["public"]["client_secret"]
    for d in DEPLOYABLES:
        assert (TOKEN_KEK_ENV in env[d.name]) is (d.name in OAUTH_CLIENT_USERS), d.name
        # The connections' static CRM tokens go to the same functions as the OAuth secrets.
        assert ("CRM_CREDENTIALS" in env[d.name]) is (d.name in CRM_TOKEN_USERS), d.name
    # Versions are the operator's pins, never "latest".
    for spec in deployed_secrets(tf, SAMPLE_APPS).values():
        assert re.fullmatch(r"[1-9]\d*", spec["version"]), spec
    # Nothing of an app travels as a plain value.
    plain = one(tf.resources[(FUNCTION_RESOURCE, "function")]["service_config"])
    assert not [k for k in plain["environment_variables"] if k.startswith("HUBSPOT_APP_")]
    assert "hubspot_apps" not in str(plain["environment_variables"])


def test_hubspot_apps_variable_pins_versions_and_names_each_kinds_secrets(tf: Terraform) -> None:
    variable = tf.variables["hubspot_apps"]
    assert variable["default"] == {}
    assert "versions" in variable["type"] and "kind" in variable["type"]
    conditions = [str(v["condition"]) for v in variable["validation"]]
    assert any("regex" in c and "a.versions" in c for c in conditions), "pin app versions"
    assert any("^[1-9][0-9]{0,19}$" in c for c in conditions), "keys are numeric app ids"
    # The names a kind must pin are the names the code reads for that kind.
    from shared.accounts.provider_apps import APP_SECRET_READERS

    kinds = next(c for c in conditions if "sort(keys(a.versions))" in c)
    for names in APP_SECRET_READERS.values():
        assert "[" + ", ".join(f'"{n}"' for n in sorted(names)) + "]" in kinds, kinds


def test_app_webhook_url_output_is_the_uri_the_app_path_verifies(tf: Terraform) -> None:
    """The target URL infra tells the operator to register for an app is routed to the app
    path, and is exactly the URI the webhook rebuilds (PUBLIC_BASE_URL + the path it sees
    behind cloudfunctions.net) to check HubSpot's v3 signature."""
    from shared.ingest.app_webhook import APP_PATH
    from shared.ingest.receive import WebhookRequest, public_uri

    output = tf.outputs["hubspot_app_webhook_urls"]["value"]
    template = re.fullmatch(
        r"\$\{\{for app_id, app in var\.hubspot_apps : app_id => \"(.*)\"\}\}", output
    )
    assert template, output
    assert template[1].startswith("${local.webhook_public_base_url}/")
    base = "https://europe-west1-p.cloudfunctions.net/webhook"  # local.webhook_public_base_url
    app_id = "1234567"
    url = template[1].replace("${local.webhook_public_base_url}", base).replace("${app_id}", app_id)
    path = url.removeprefix(base)  # what the function sees: no /webhook prefix
    match = APP_PATH.match(path)
    assert match and match["app_id"] == app_id and match["provider"] == "hubspot"
    request = WebhookRequest(
        method="POST",
        path=path,
        query_string="",
        headers={"Host": "10.0.0.7:8080"},
        scheme="http",
        host="10.0.0.7:8080",
        read=lambda n: b"",
        content_length=0,
        environ={},
    )
    service = one(tf.resources[(FUNCTION_RESOURCE, "function")]["service_config"])
    assert "local.webhook_public_base_url" in service["environment_variables"]["PUBLIC_BASE_URL"]
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PUBLIC_BASE_URL", base)
        assert public_uri(request) == url


def test_oauth_redirect_url_ops_sends_is_where_the_webhook_function_serves_the_callback(
    tf: Terraform, db: Any
) -> None:
    """The redirect URL infra tells the operator to register, and the redirect_uri ops sends
    (ONCEFLOW_OAUTH_REDIRECT_URL, ops and webhook), are one value on the webhook function's
    public base (the same base it verifies signatures against); the path that URL reaches the
    function at is the one functions/webhook.py hands to the install callback (which answers
    its page)."""
    from flask import Flask

    from functions.webhook import webhook
    from shared.providers.install import (
        CALLBACK_PATH,
        REDIRECT_URL_ENV,
        configured_redirect_url,
    )

    local = tf.locals["hubspot_oauth_redirect_url"]
    assert local == "${local.webhook_public_base_url}" + CALLBACK_PATH
    assert (
        tf.outputs["hubspot_oauth_redirect_url"]["value"] == "${local.hubspot_oauth_redirect_url}"
    )
    service = one(tf.resources[(FUNCTION_RESOURCE, "function")]["service_config"])
    # ops sends it; webhook repeats an app's own callback URL (it + /<app id>) at the exchange
    # of an install that started at HubSpot.
    assert service["environment_variables"][REDIRECT_URL_ENV] == (
        '${contains(["ops", "webhook"], each.key) ? local.hubspot_oauth_redirect_url : ""}'
    )
    assert "local.webhook_public_base_url" in service["environment_variables"]["PUBLIC_BASE_URL"]
    base = "https://europe-west1-p.cloudfunctions.net/webhook"  # local.webhook_public_base_url
    url = local.replace("${local.webhook_public_base_url}", base)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(REDIRECT_URL_ENV, url)
        assert configured_redirect_url() == url  # ops starts installs with it
    path = url.removeprefix(base)  # what the function sees: no /webhook prefix
    assert path == CALLBACK_PATH
    # A redirect without a state reaches the callback's page (a 400 saying so), not the
    # webhook receiver's JSON 404/405.
    with Flask(__name__).test_request_context(path, method="GET"):
        from flask import request

        page = webhook(request)
    assert page.status_code == 400
    assert page.mimetype == "text/html"
    # The app's own callback (installs that start at HubSpot) reaches the callback too.
    with Flask(__name__).test_request_context(path + "/123", method="GET"):
        from flask import request

        own = webhook(request)
    assert own.status_code == 400 and own.mimetype == "text/html"
    assert "no or bad state" in page.get_data(as_text=True)


def test_readme_registers_the_app_under_the_names_infra_hands_out(tf: Terraform, db: Any) -> None:
    """The README's registration SQL runs on the real schema and names exactly the variables
    Terraform gives the functions for that app; its `gcloud` lines add versions to the secrets
    Terraform declares for it."""
    from shared.accounts import provider_apps
    from shared.providers.hubspot import apps as hubspot_apps

    section = _readme_section("Register the HubSpot app")
    sql = re.search(r"```sql\n(.*?)```", section, re.S)
    assert sql
    with db.transaction() as tx:
        tx.execute(sql[1].strip().rstrip(";"))
        app = provider_apps.get_app(tx, "hubspot", "123")
    assert app is not None and app.kind == "public"
    assert app.client_secret_env == hubspot_apps.secret_env("123", "client_secret")
    assert app.developer_credential_env == hubspot_apps.secret_env("123", "developer_key")
    tfvars = re.search(r'"123" = \{ kind = "public", versions = \{ (.*?) \} \}', section)
    assert tfvars
    versions = dict(re.findall(r'(\w+) = "(\d+)"', tfvars[1]))
    secrets = deployed_secrets(tf, {"123": {"kind": "public", "versions": versions}})
    added = set(re.findall(r"gcloud secrets versions add (\S+)", section))
    assert added == {s for s in secrets if "-app-123-" in s} | {"onceflow-token-kek"}
    assert set(secrets) >= added


def test_approval_links_can_be_signed_in_the_cloud(tf: Terraform) -> None:
    # The ops function makes and checks approval links with this key; without a secret for it
    # every link request in a deployment is refused ("no link can be made or used").
    from shared.ops import approval_links

    handed = {
        spec["env_var"]: set(spec["functions"])
        for spec in tf.variables["secrets"]["default"].values()
    }
    # ... and the sweep mails approval links (channels.email: shared/steps/approval_messages.py).
    assert handed.get(approval_links.SECRET_ENV) == {"ops", "webhook", "sweep"}


# --- people's browsers ----------------------------------------------------------------------


def test_a_browser_without_a_google_token_opens_an_approval_link_and_nothing_else(
    tf: Terraform, db: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The deployed wiring: webhook is the only function anyone may call; ops tells approvers
    the link on webhook's public URL; webhook has the link key and may dispatch the step a
    decision resumes; and through webhook's own entry point a signed link opens, while every
    other page or API path of ops is not there."""
    from flask import Flask

    from functions.webhook import webhook
    from shared.ops import approval_links
    from tests.test_approvals import _parked

    service = one(tf.resources[(FUNCTION_RESOURCE, "function")]["service_config"])
    assert service["environment_variables"][approval_links.PUBLIC_URL_ENV] == (
        '${contains(["ops", "sweep"], each.key) ? local.webhook_public_base_url : ""}'
    )
    publishers = tf.locals["publishers"]
    assert "step_ready" in publishers["webhook"]
    handed = {
        spec["env_var"]: set(spec["functions"])
        for spec in tf.variables["secrets"]["default"].values()
    }
    assert "webhook" in handed[approval_links.SECRET_ENV]

    monkeypatch.setenv(approval_links.SECRET_ENV, "s" * 32)
    base = "https://europe-west1-p.cloudfunctions.net/webhook"
    monkeypatch.setenv(approval_links.PUBLIC_URL_ENV, base)
    _run_id, park_id, _q, _lookup = _parked(db)
    with db.transaction() as tx:
        deadline = tx.one("SELECT deadline FROM step_parks WHERE id = :p", p=park_id)["deadline"]
    link = approval_links.make_link(park_id, "erin", deadline)
    url = approval_links.public_url(link)
    assert url == base + link.path

    def open_page(path: str, method: str = "GET") -> Any:
        with Flask(__name__).test_request_context(path, method=method):
            from flask import request

            return webhook(request)

    page = open_page(url.removeprefix(base))  # the function sees no /webhook prefix
    assert page.status_code == 200 and page.mimetype == "text/html"
    assert "20% discount on deal 7" in page.get_data(as_text=True)
    forged = open_page(link.path[:-4] + ("0000" if not link.path.endswith("0000") else "1111"))
    assert forged.status_code == 403
    for elsewhere in ("/ui", "/ui/runs", "/ui/login", "/ui/approvals", "/v1/runs", "/openapi.json"):
        answer = open_page(elsewhere)
        assert answer.status_code in (404, 405), elsewhere
        assert answer.mimetype == "application/json", elsewhere  # the receiver's, not a page


def test_the_ops_page_is_behind_identity_aware_proxy_for_named_people(tf: Terraform) -> None:
    backend = tf.resources[("google_compute_backend_service", "ops")]
    assert one(backend["iap"])["enabled"] is True
    neg = tf.resources[("google_compute_region_network_endpoint_group", "ops")]
    assert neg["network_endpoint_type"] == "SERVERLESS"
    assert function_ref(one(neg["cloud_run"])["service"]) == "ops"
    members = tf.resources[("google_iap_web_backend_service_iam_member", "ops")]
    assert members["role"] == "roles/iap.httpsResourceAccessor"
    assert "var.ops_iap_members" in members["for_each"]
    assert "allUsers" in str(tf.variables["ops_iap_members"]["validation"])
    # The proxy reaches the IAM-gated function as IAP's service agent, and nobody else new.
    invoker = tf.resources[("google_cloud_run_service_iam_member", "ops_iap_invoker")]
    assert function_ref(invoker["service"]) == "ops"
    assert "@gcp-sa-iap.iam.gserviceaccount.com" in invoker["member"]
    assert "iap.googleapis.com" in tf.locals["apis"]
    # Off unless a domain is given: every piece counts on it.
    for (rtype, name), body in tf.resources.items():
        if name == "ops" and rtype.startswith(("google_compute_", "google_iap_")):
            gate = body.get("count", body.get("for_each"))
            assert gate is not None and "local.ops_behind_iap" in str(gate), rtype


def test_ops_may_redrive_what_the_dead_letter_holds_keep(tf: Terraform) -> None:
    """shared/ops/redrive.py pulls and acks each hold and publishes to the topic it maps to:
    ops needs subscriber on every hold and publisher on every such topic."""
    from shared.ops.redrive import DEAD_LETTER_HOLDS

    grant = tf.resources[("google_pubsub_subscription_iam_member", "ops_redrive")]
    assert grant["role"] == "roles/pubsub.subscriber"
    assert grant["member"] == '${google_service_account.function["ops"].member}'
    assert grant["subscription"] == "${each.value}"
    held = {
        tf.resources[("google_pubsub_subscription", ref_to("google_pubsub_subscription", v))][
            "name"
        ]
        for v in grant["for_each"].values()
    }
    assert held == set(DEAD_LETTER_HOLDS)
    topics = {
        key: tf.resources[("google_pubsub_topic", ref_to("google_pubsub_topic", ref))]["name"]
        for key, ref in tf.locals["topic_names"].items()
    }
    published = {topics[key] for key in tf.locals["publishers"]["ops"]}
    assert set(DEAD_LETTER_HOLDS.values()) <= published


def test_the_first_admin_token_can_be_minted_in_the_cloud_and_no_secret_is_unread(
    tf: Terraform,
) -> None:
    # Issue 24: the first admin ops token comes from the one-time bootstrap secret, handed to
    # ops only; the token pepper a first deployment had to fill was read by nothing.
    from shared.ops import auth

    handed = {
        spec["env_var"]: set(spec["functions"])
        for spec in tf.variables["secrets"]["default"].values()
    }
    assert handed.get(auth.BOOTSTRAP_SECRET_ENV) == {"ops"}
    assert "OPS_TOKEN_PEPPER" not in handed
    assert not any("pepper" in secret_id for secret_id in tf.variables["secrets"]["default"])
