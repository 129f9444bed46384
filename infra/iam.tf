# One service account per role, each granted only what its code path needs.
#
#   onceflow-fn-<function>  runtime identity of one function (and its IAM database user)
#   onceflow-pubsub-push    signs the OIDC token of the push subscriptions
#   onceflow-scheduler      signs the OIDC token of the scheduler jobs
#   onceflow-deployer       Cloud Build: migrations, grants, terraform apply
#   onceflow-build          builds the functions' images from the source archive

resource "google_service_account" "function" {
  for_each     = local.functions
  account_id   = "onceflow-fn-${replace(each.key, "_", "-")}"
  display_name = "onceflow ${each.key} function"
  depends_on   = [google_project_service.enabled]
}

resource "google_service_account" "pubsub_push" {
  account_id   = "onceflow-pubsub-push"
  display_name = "onceflow Pub/Sub push subscriptions"
  depends_on   = [google_project_service.enabled]
}

resource "google_service_account" "scheduler" {
  account_id   = "onceflow-scheduler"
  display_name = "onceflow Cloud Scheduler jobs"
  depends_on   = [google_project_service.enabled]
}

resource "google_service_account" "build" {
  account_id   = "onceflow-build"
  display_name = "onceflow function builds"
  depends_on   = [google_project_service.enabled]
}

resource "google_service_account" "deployer" {
  account_id   = var.deployer_service_account
  display_name = "onceflow Cloud Build deployer"
  depends_on   = [google_project_service.enabled]
}

locals {
  pubsub_service_agent = "serviceAccount:service-${data.google_project.this.number}@gcp-sa-pubsub.iam.gserviceaccount.com"

  topic_names = {
    trigger_events = google_pubsub_topic.trigger_events.name
    step_ready     = google_pubsub_topic.step_ready.name
  }

  # Who publishes where (messages carry ids only):
  #   publish_outbox: trigger events, after their outbox row committed;
  #   webhook: the same, from its in-process fast-path nudge (shared/ingest/nudge.py runs
  #            one bounded drain + publish pass after a delivery is stored);
  #   webhook: also the step an approval link's decision resumed (the link is served there);
  #   admit_event, advance_step: the first / next steps they created;
  #   sweep: step messages that were lost after their row committed;
  #   ops: steps of a replayed or retried run, and dead letters it redrives to either topic
  #        (shared/ops/redrive.py, DEAD_LETTER_HOLDS).
  publishers = {
    webhook        = ["trigger_events", "step_ready"]
    publish_outbox = ["trigger_events"]
    admit_event    = ["step_ready"]
    advance_step   = ["step_ready"]
    sweep          = ["step_ready"]
    ops            = ["step_ready", "trigger_events"]
  }
  publisher_grants = merge([
    for fn, topics in local.publishers : { for t in topics : "${fn}/${t}" => { function = fn, topic = t } }
  ]...)

  sql_roles = ["roles/cloudsql.client", "roles/cloudsql.instanceUser"]
  sql_grants = merge([
    for fn, f in local.functions : { for r in local.sql_roles : "${fn}/${r}" => { function = fn, role = r } } if f.uses_database
  ]...)

  secret_grants = merge([
    for id, s in local.secrets : { for fn in s.functions : "${id}/${fn}" => { secret = id, function = fn } }
  ]...)

  pubsub_functions   = { for name, f in local.functions : name => f if f.trigger == "pubsub" }
  scheduled_function = { for name, f in local.functions : name => f if f.trigger == "schedule" }
}

# --- database -------------------------------------------------------------------------------

resource "google_project_iam_member" "function_sql" {
  for_each = local.sql_grants
  project  = var.project_id
  role     = each.value.role
  member   = google_service_account.function[each.value.function].member
}

resource "google_project_iam_member" "deployer_sql" {
  for_each = toset(local.sql_roles)
  project  = var.project_id
  role     = each.value
  member   = google_service_account.deployer.member
}

# --- telemetry (only with var.tracing = "gcp": shared/core/tracing.py) -----------------------

resource "google_project_iam_member" "function_telemetry" {
  for_each = var.tracing == "gcp" ? merge([
    for fn, _ in local.functions : {
      for r in ["roles/cloudtrace.agent", "roles/monitoring.metricWriter"] :
      "${fn}/${r}" => { function = fn, role = r }
    }
  ]...) : {}
  project = var.project_id
  role    = each.value.role
  member  = google_service_account.function[each.value.function].member
}

# --- Pub/Sub --------------------------------------------------------------------------------

resource "google_pubsub_topic_iam_member" "publisher" {
  for_each = local.publisher_grants
  topic    = local.topic_names[each.value.topic]
  role     = "roles/pubsub.publisher"
  member   = google_service_account.function[each.value.function].member
}

# Redrive (shared/ops/redrive.py) pulls and acknowledges the dead-letter holds from ops, then
# publishes each message back to its topic (the publisher grants above).
resource "google_pubsub_subscription_iam_member" "ops_redrive" {
  for_each = {
    trigger_events = google_pubsub_subscription.trigger_events_dead_letter.name
    step_ready     = google_pubsub_subscription.step_ready_dead_letter.name
  }
  subscription = each.value
  role         = "roles/pubsub.subscriber"
  member       = google_service_account.function["ops"].member
}

# The Pub/Sub service agent forwards undeliverable messages: it must publish to the
# dead-letter topics and subscribe (acknowledge) on the source subscriptions.
resource "google_pubsub_topic_iam_member" "dead_letter_publisher" {
  for_each = {
    trigger_events = google_pubsub_topic.trigger_events_dead_letter.name
    step_ready     = google_pubsub_topic.step_ready_dead_letter.name
  }
  topic  = each.value
  role   = "roles/pubsub.publisher"
  member = local.pubsub_service_agent
}

resource "google_pubsub_subscription_iam_member" "dead_letter_subscriber" {
  for_each = {
    admit_event  = google_pubsub_subscription.push["admit_event"].name
    advance_step = google_pubsub_subscription.push["advance_step"].name
  }
  subscription = each.value
  role         = "roles/pubsub.subscriber"
  member       = local.pubsub_service_agent
}

# The service agent mints the push subscriptions' OIDC tokens as onceflow-pubsub-push.
resource "google_service_account_iam_member" "pubsub_token_creator" {
  service_account_id = google_service_account.pubsub_push.name
  role               = "roles/iam.serviceAccountTokenCreator"
  member             = local.pubsub_service_agent
}

# --- secrets --------------------------------------------------------------------------------

# Per secret, per function that reads it: no function can read another's secrets.
resource "google_secret_manager_secret_iam_member" "accessor" {
  for_each  = local.secret_grants
  secret_id = google_secret_manager_secret.secret[each.value.secret].id
  role      = "roles/secretmanager.secretAccessor"
  member    = google_service_account.function[each.value.function].member
}

# --- invokers (roles/run.invoker on each gen2 function's Cloud Run service) -----------------

# The only public function: webhook authenticates callers by the CRM's request signature,
# HubSpot's browser redirect back from an app install by its single-use state, and an approver
# opening a signed approval link by its signature (both pages live here, not on ops: IAM is per
# service, and a browser has no Google identity token). People reach the rest of the ops page
# through Identity-Aware Proxy (iap.tf).
resource "google_cloud_run_service_iam_member" "webhook_public" {
  location = var.region
  service  = google_cloudfunctions2_function.function["webhook"].name
  role     = "roles/run.invoker"
  member   = "allUsers"
}

resource "google_cloud_run_service_iam_member" "pubsub_push_invoker" {
  for_each = local.pubsub_functions
  location = var.region
  service  = google_cloudfunctions2_function.function[each.key].name
  role     = "roles/run.invoker"
  member   = google_service_account.pubsub_push.member
}

resource "google_cloud_run_service_iam_member" "scheduler_invoker" {
  for_each = local.scheduled_function
  location = var.region
  service  = google_cloudfunctions2_function.function[each.key].name
  role     = "roles/run.invoker"
  member   = google_service_account.scheduler.member
}

resource "google_cloud_run_service_iam_member" "ops_invoker" {
  for_each = toset(var.ops_invokers)
  location = var.region
  service  = google_cloudfunctions2_function.function["ops"].name
  role     = "roles/run.invoker"
  member   = each.value
}

# --- function builds ------------------------------------------------------------------------

# The roles Google's "build service account" page (Cloud Run functions) lists for a custom
# build account: write the build log, push the image to Artifact Registry, read the source
# from (and keep build files in) Cloud Storage.
resource "google_project_iam_member" "build" {
  for_each = toset([
    "roles/logging.logWriter",
    "roles/artifactregistry.writer",
    "roles/storage.objectAdmin",
  ])
  project = var.project_id
  role    = each.value
  member  = google_service_account.build.member
}

# --- health view ----------------------------------------------------------------------------

# ops' GET /v1/health reads each scheduler job's last attempt (shared/ops/health.py).
resource "google_project_iam_member" "ops_scheduler_viewer" {
  project = var.project_id
  role    = "roles/cloudscheduler.viewer"
  member  = google_service_account.function["ops"].member
}
