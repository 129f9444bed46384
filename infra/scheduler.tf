# Cloud Scheduler fires at most once a minute; each scheduled function loops inside its
# invocation until shortly before its timeout, so work is picked up within seconds.
#
# The local stack's scheduler reads `schedule` from these resources (python-hcl2), so the
# cadence lives here only: keep each one a plain string literal, in a job named after its
# function.
#
# Targets and audiences are the run.app URLs (service_config[0].uri): the scheduled functions
# are ALLOW_INTERNAL_ONLY, and Cloud Run counts Cloud Scheduler as internal only when it calls
# the default run.app URL (see pubsub.tf).
#
# attempt_deadline covers the function's timeout_seconds (60) with room for a cold start.
# retry_count = 0: the next tick is a minute away and does the same work, so a retry would
# only overlap it.

resource "google_cloud_scheduler_job" "drain_inbox" {
  name             = "drain-inbox"
  region           = var.region
  schedule         = "* * * * *"
  time_zone        = "Etc/UTC"
  attempt_deadline = "90s"

  retry_config {
    retry_count = 0
  }

  http_target {
    http_method = "POST"
    uri         = google_cloudfunctions2_function.function["drain_inbox"].service_config[0].uri
    headers     = { "Content-Type" = "application/json" }
    body        = base64encode("{}")
    oidc_token {
      service_account_email = google_service_account.scheduler.email
      audience              = google_cloudfunctions2_function.function["drain_inbox"].service_config[0].uri
    }
  }

  depends_on = [google_cloud_run_service_iam_member.scheduler_invoker]
}

resource "google_cloud_scheduler_job" "publish_outbox" {
  name             = "publish-outbox"
  region           = var.region
  schedule         = "* * * * *"
  time_zone        = "Etc/UTC"
  attempt_deadline = "90s"

  retry_config {
    retry_count = 0
  }

  http_target {
    http_method = "POST"
    uri         = google_cloudfunctions2_function.function["publish_outbox"].service_config[0].uri
    headers     = { "Content-Type" = "application/json" }
    body        = base64encode("{}")
    oidc_token {
      service_account_email = google_service_account.scheduler.email
      audience              = google_cloudfunctions2_function.function["publish_outbox"].service_config[0].uri
    }
  }

  depends_on = [google_cloud_run_service_iam_member.scheduler_invoker]
}

resource "google_cloud_scheduler_job" "sweep" {
  name             = "sweep"
  region           = var.region
  schedule         = "* * * * *"
  time_zone        = "Etc/UTC"
  attempt_deadline = "90s"

  retry_config {
    retry_count = 0
  }

  http_target {
    http_method = "POST"
    uri         = google_cloudfunctions2_function.function["sweep"].service_config[0].uri
    headers     = { "Content-Type" = "application/json" }
    body        = base64encode("{}")
    oidc_token {
      service_account_email = google_service_account.scheduler.email
      audience              = google_cloudfunctions2_function.function["sweep"].service_config[0].uri
    }
  }

  depends_on = [google_cloud_run_service_iam_member.scheduler_invoker]
}
