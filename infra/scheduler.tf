# Cloud Scheduler fires at most once a minute; each scheduled function loops inside its
# invocation until shortly before its timeout, so work is picked up within seconds.
#
# One job per scheduled function, keyed by the function's name in local.scheduled_functions.
# The local stack's scheduler reads the cadence from here (devstack/terraform.py evaluates
# `each.value` of this literal map), so it lives here only: keep each `schedule` a plain
# string literal.
#
# Targets and audiences are the run.app URLs (service_config[0].uri): the scheduled functions
# are ALLOW_INTERNAL_ONLY, and Cloud Run counts Cloud Scheduler as internal only when it calls
# the default run.app URL (see pubsub.tf).
#
# attempt_deadline covers the function's timeout_seconds (60) with room for a cold start.
# retry_count = 0: the next tick is a minute away and does the same work, so a retry would
# only overlap it.

locals {
  scheduled_functions = {
    drain_inbox    = { job = "drain-inbox", schedule = "* * * * *" }
    publish_outbox = { job = "publish-outbox", schedule = "* * * * *" }
    sweep          = { job = "sweep", schedule = "* * * * *" }
  }
}

resource "google_cloud_scheduler_job" "function" {
  for_each = local.scheduled_functions

  name             = each.value.job
  region           = var.region
  schedule         = each.value.schedule
  time_zone        = "Etc/UTC"
  attempt_deadline = "90s"

  retry_config {
    retry_count = 0
  }

  http_target {
    http_method = "POST"
    uri         = google_cloudfunctions2_function.function[each.key].service_config[0].uri
    headers     = { "Content-Type" = "application/json" }
    body        = base64encode("{}")
    oidc_token {
      service_account_email = google_service_account.scheduler.email
      audience              = google_cloudfunctions2_function.function[each.key].service_config[0].uri
    }
  }

  depends_on = [google_cloud_run_service_iam_member.scheduler_invoker]
}

# The jobs were three resources before: a deployed project keeps them, under the new address.
moved {
  from = google_cloud_scheduler_job.drain_inbox
  to   = google_cloud_scheduler_job.function["drain_inbox"]
}

moved {
  from = google_cloud_scheduler_job.publish_outbox
  to   = google_cloud_scheduler_job.function["publish_outbox"]
}

moved {
  from = google_cloud_scheduler_job.sweep
  to   = google_cloud_scheduler_job.function["sweep"]
}
