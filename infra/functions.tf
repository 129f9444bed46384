# The seven Cloud Run functions (gen2), all built from the one archive in bundle.tf.
#
# `local.functions` mirrors shared/core/deployables.py (DEPLOYABLES) row for row; tests/test_infra.py
# fails when the two disagree on a name, entry point, trigger or public flag.
#
# Pub/Sub delivery: admit_event and advance_step have NO event_trigger. Eventarc would create
# and own their subscriptions, and the provider cannot give an Eventarc-managed subscription a
# dead-letter policy. Instead they deploy as HTTP functions and pubsub.tf declares our own push
# subscriptions (OIDC token, retry policy, dead-letter topic) pointing at their URLs. Their
# code keeps the @functions_framework.cloud_event signature: functions-framework turns the raw
# push body ({"message": {...}, "subscription": ...}) into a messagePublished CloudEvent, so
# the same code runs behind the emulator's push subscriptions locally. A normal return is a 2xx
# (ack); a raise is a 500 (nack), which the subscription's retry policy and dead-letter topic
# bound.
#
# Sizing (per function below):
#   cpu = "1": without it a 256Mi instance gets about a sixth of a vCPU, so a Python cold start
#     (imports, pydantic models, the connector) takes seconds, and webhook risks HubSpot's
#     few-second delivery timeout. CPU is billed only while a request runs (throttled between
#     requests), so a whole vCPU costs little more than a slow one.
#   ingress: ALLOW_INTERNAL_ONLY for the five functions that only Pub/Sub push (admit_event,
#     advance_step) and Cloud Scheduler (drain_inbox, publish_outbox, sweep) call. Cloud Run's
#     "internal" ingress admits requests from Pub/Sub, Cloud Scheduler, Eventarc and Cloud Tasks
#     of the same project (Cloud Run docs, "Restrict network ingress"); IAM (iam.tf) still
#     checks their OIDC tokens. webhook (the CRM, from the internet) and ops (people, from
#     their workstations) stay ALLOW_ALL behind signatures and IAM. See infra/README.md,
#     "Ingress", for the caveat on first-generation functions.
locals {
  functions = {
    webhook = {
      entry_point     = "webhook"
      trigger         = "http"
      public          = true
      uses_database   = true
      timeout_seconds = 30
      memory          = "256Mi"
      cpu             = "1"
      ingress         = "ALLOW_ALL"
    }
    drain_inbox = {
      entry_point     = "drain_inbox"
      trigger         = "schedule"
      public          = false
      uses_database   = true
      timeout_seconds = 60
      memory          = "256Mi"
      cpu             = "1"
      ingress         = "ALLOW_INTERNAL_ONLY"
    }
    publish_outbox = {
      entry_point     = "publish_outbox"
      trigger         = "schedule"
      public          = false
      uses_database   = true
      timeout_seconds = 60
      memory          = "256Mi"
      cpu             = "1"
      ingress         = "ALLOW_INTERNAL_ONLY"
    }
    admit_event = {
      entry_point     = "admit_event"
      trigger         = "pubsub"
      public          = false
      uses_database   = true
      timeout_seconds = 120
      memory          = "256Mi"
      cpu             = "1"
      ingress         = "ALLOW_INTERNAL_ONLY"
    }
    advance_step = {
      entry_point     = "advance_step"
      trigger         = "pubsub"
      public          = false
      uses_database   = true
      timeout_seconds = 300
      memory          = "512Mi"
      cpu             = "1"
      ingress         = "ALLOW_INTERNAL_ONLY"
    }
    sweep = {
      entry_point     = "sweep"
      trigger         = "schedule"
      public          = false
      uses_database   = true
      timeout_seconds = 60
      memory          = "256Mi"
      cpu             = "1"
      ingress         = "ALLOW_INTERNAL_ONLY"
    }
    ops = {
      entry_point     = "ops"
      trigger         = "http"
      public          = false
      uses_database   = true
      timeout_seconds = 60
      memory          = "256Mi"
      cpu             = "1"
      ingress         = "ALLOW_ALL"
    }
  }

  # Each instance's pool: one connection per request it serves at once (a thread never holds
  # two: shared/core/db.py NestedCheckout) plus one for its background thread (the lease keeper in
  # advance_step and ops, the nudge in webhook). The same rule as shared/core/db.py pool_size_for.
  db_pool_size = {
    for name in keys(local.functions) : name => lookup(var.request_concurrency, name, 1) + 1
  }

  # Connections the functions can open at full scale-out: every instance fills its pool.
  db_connection_demand = sum([
    for name, f in local.functions : lookup(var.max_instances, name, 0) * local.db_pool_size[name] if f.uses_database
  ])
  db_connection_limit = var.db_max_connections - var.db_connection_reserve

  # Known before the function exists (its own url attribute would be a cycle): gen2 functions
  # answer at https://REGION-PROJECT.cloudfunctions.net/NAME.
  webhook_public_base_url = coalesce(var.webhook_public_base_url, "https://${var.region}-${var.project_id}.cloudfunctions.net/webhook")
  # HubSpot's browser redirect back from an app install, on webhook (outputs.tf gives it).
  hubspot_oauth_redirect_url = "${local.webhook_public_base_url}/oauth/hubspot/callback"
}

# Fails `terraform plan` when a scale-out could exhaust Postgres: past max_connections new
# connections are refused, and every function would then fail at once.
resource "terraform_data" "db_connection_budget" {
  input = {
    demand = local.db_connection_demand
    limit  = local.db_connection_limit
  }

  lifecycle {
    precondition {
      condition     = local.db_connection_demand < local.db_connection_limit
      error_message = "Connection budget exceeded: sum(max_instances x (request_concurrency + 1)) over the database-using functions must stay below db_max_connections - db_connection_reserve. Lower max_instances or request_concurrency, or raise db_max_connections with a bigger sql_tier."
    }
    precondition {
      condition     = length(setsubtract(keys(local.functions), keys(var.max_instances))) == 0
      error_message = "max_instances needs an entry for every function."
    }
    precondition {
      condition     = length(setsubtract(keys(local.functions), keys(var.request_concurrency))) == 0
      error_message = "request_concurrency needs an entry for every function."
    }
  }
}

resource "google_cloudfunctions2_function" "function" {
  for_each = local.functions

  name        = replace(each.key, "_", "-")
  location    = var.region
  description = "onceflow ${each.key} (${each.value.trigger})"

  labels = local.labels

  build_config {
    runtime     = "python311"
    entry_point = each.value.entry_point
    # Builds run as onceflow-build (iam.tf), not the Compute Engine default account, which
    # new projects no longer give Editor and older ones give far too much.
    service_account = google_service_account.build.id
    # Build-time only: the buildpack reads main.py at the archive root (its default, made
    # explicit). Runtime configuration belongs in service_config.
    environment_variables = {
      GOOGLE_FUNCTION_SOURCE = "main.py"
    }
    source {
      storage_source {
        bucket = google_storage_bucket.source.name
        object = google_storage_bucket_object.bundle.name
      }
    }
  }

  service_config {
    max_instance_count = var.max_instances[each.key]
    # Only webhook keeps a warm instance (var.webhook_min_instances): the CRM's delivery
    # timeout is a few seconds and a cold start eats most of it. The others are fed by
    # Pub/Sub and the scheduler, which wait and retry.
    min_instance_count = each.key == "webhook" ? var.webhook_min_instances : 0
    # Several requests per instance (var.request_concurrency): a step mostly waits on the CRM
    # and the database, and one vCPU serves others meanwhile instead of billing a 100 ms
    # minimum per request. The pool grows with it (DB_POOL_SIZE below) and the connection
    # budget above counts it. See infra/README.md, "Capacity", for the measurement.
    max_instance_request_concurrency = var.request_concurrency[each.key]
    available_memory                 = each.value.memory
    available_cpu                    = each.value.cpu
    timeout_seconds                  = each.value.timeout_seconds
    # Network gate per function (see the sizing note above); IAM is the second gate (iam.tf):
    # only webhook grants allUsers.
    ingress_settings               = each.value.ingress
    all_traffic_on_latest_revision = true
    service_account_email          = google_service_account.function[each.key].email

    # Private IP to Cloud SQL goes through the connector; CRM calls leave directly.
    vpc_connector                 = google_vpc_access_connector.functions.id
    vpc_connector_egress_settings = "PRIVATE_RANGES_ONLY"

    # Plain values only. Anything secret is in secret_environment_variables below.
    environment_variables = {
      GOOGLE_CLOUD_PROJECT     = var.project_id
      INSTANCE_CONNECTION_NAME = google_sql_database_instance.main.connection_name
      DB_IAM_USER              = trimsuffix(google_service_account.function[each.key].email, ".gserviceaccount.com")
      DB_NAME                  = google_sql_database.onceflow.name
      DB_IP_TYPE               = "private"
      DB_POOL_SIZE             = tostring(local.db_pool_size[each.key])
      # functions-framework's gunicorn threads (its default is 4 per visible CPU, which on
      # Cloud Run need not be the instance's one vCPU). Equal to the concurrency, as Cloud
      # Run's concurrency page asks of Python functions
      # (https://cloud.google.com/functions/docs/configuring/concurrency).
      THREADS   = tostring(var.request_concurrency[each.key])
      LOG_LEVEL = var.log_level
      # OpenTelemetry (shared/core/tracing.py): off, or spans to Cloud Trace and metrics to
      # Cloud Monitoring (the grants in iam.tf follow this variable).
      ONCEFLOW_TRACING              = var.tracing
      ONCEFLOW_TRACING_SAMPLE_RATIO = tostring(var.tracing_sample_ratio)
      # The URI HubSpot signs is the URL it called. Behind the cloudfunctions.net URL the
      # request path has no function-name prefix, so without this the signature base differs
      # and every delivery is refused 401 (shared/ingest/receive.py, public_uri).
      PUBLIC_BASE_URL = each.key == "webhook" ? local.webhook_public_base_url : ""
      # The redirect URI an app install sends HubSpot (shared/providers/install.py): the callback is
      # served by webhook, the one public function, because ops is IAM-gated and HubSpot's
      # redirect is a browser without a Google identity token. webhook reads it too: an install
      # that starts at HubSpot comes back to the app's own callback (this URL + /<app id>),
      # and the code exchange must repeat that redirect URI exactly.
      ONCEFLOW_OAUTH_REDIRECT_URL = contains(["ops", "webhook"], each.key) ? local.hubspot_oauth_redirect_url : ""
      # Where approvers open the signed links ops makes and sweep mails (channels.email;
      # shared/steps/link_signing.py, PUBLIC_URL_ENV): webhook serves them, for the same reason
      # as the install callback.
      ONCEFLOW_PUBLIC_URL = contains(["ops", "sweep"], each.key) ? local.webhook_public_base_url : ""
      # Where ops' health view reads the scheduler jobs (shared/ops/health.py).
      SCHEDULER_LOCATION = var.region
      # The Cloud Functions API adds this to every gen2 function; declared so that a plan of
      # an unchanged tree shows no update.
      LOG_EXECUTION_ID = "true"
    }

    dynamic "secret_environment_variables" {
      for_each = { for id, s in local.secrets : id => s if contains(s.functions, each.key) }
      content {
        key        = secret_environment_variables.value.env_var
        project_id = var.project_id
        secret     = google_secret_manager_secret.secret[secret_environment_variables.key].secret_id
        version    = secret_environment_variables.value.version
      }
    }
  }

  depends_on = [
    terraform_data.db_connection_budget,
    google_project_iam_member.build,
    google_secret_manager_secret_iam_member.accessor,
    google_project_iam_member.function_sql,
    google_sql_user.function,
  ]
}
