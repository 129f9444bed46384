# Alerts: something is stuck or failing, and someone should look.
#
# Log-based metrics count the engine's structured event lines. Each line has `event` and its
# fields at the top of the JSON payload (shared/core/logs.py, EVENTS is the one list of names and
# fields; tests/test_log_events.py checks that the engine writes them in that shape, and
# tests/test_infra.py that every metric here matches one of them):
#
#   run_failed       a run ended failed (advance_step's settle, or the sweep's lease reclaim)
#   breaker_tripped  a workflow's circuit breaker opened after consecutive failed runs
#                    (shared/gates/breaker.py); its events are refused workflow_paused
#   dead_lettered    an inbox row marked dead, or a Pub/Sub message recorded as poisoned
#   lease_expired    the sweep reclaimed a step whose lease expired (a process died or hung)
#   backlog_age      once a minute from the sweep: age of the oldest undrained inbox row,
#                    unpublished outbox row and never-claimed pending step
#
# Messages Pub/Sub itself dead-lettered (10 failed pushes) are watched on the hold
# subscriptions' backlog, a built-in metric. Thresholds: var.alert_thresholds; who is told:
# var.notification_channels.
locals {
  log_filter = "resource.type=\"cloud_run_revision\""

  counted_events = {
    run_failed = {
      title     = "runs failed"
      threshold = var.alert_thresholds.failed_runs
      runbook   = "Runs failed. Open the ops page (/ui) or GET /v1/runs?status=failed: each failed run names its step and error; fix the cause, then retry or replay it."
    }
    breaker_tripped = {
      title     = "circuit breaker tripped"
      threshold = var.alert_thresholds.breaker_trips
      runbook   = "A workflow's circuit breaker opened: its runs kept failing, so its events are now refused (workflow_paused). GET /v1/workflows/{id}/breaker says why; look at its failed runs (GET /v1/runs?status=failed), fix the cause, then POST /v1/workflows/{id}/resume (half_open: true to try one run first)."
    }
    dead_lettered = {
      title     = "work dead-lettered"
      threshold = var.alert_thresholds.dead_letters
      runbook   = "An inbox row ran out of attempts or a Pub/Sub message could not be read. GET /v1/health shows the counts; the rows are in webhook_inbox (status dead) and poisoned_messages with their reason."
    }
    lease_expired = {
      title     = "step leases expired"
      threshold = var.alert_thresholds.lease_expiries
      runbook   = "advance_step instances died or hung while running steps (out of memory, timeout, crash). The sweep reclaimed them; look at advance_step's logs around the time for the cause."
    }
  }

  # The fields of the backlog_age line, one metric and alert each.
  backlog_ages = {
    inbox_oldest = {
      field     = "inbox_oldest_seconds"
      title     = "oldest undrained inbox row"
      threshold = var.alert_thresholds.inbox_oldest_seconds
      runbook   = "Webhook deliveries are stored but not drained: is the drain-inbox scheduler job running (GET /v1/health), and does drain_inbox log errors?"
    }
    outbox_oldest = {
      field     = "outbox_oldest_seconds"
      title     = "oldest unpublished outbox row"
      threshold = var.alert_thresholds.outbox_oldest_seconds
      runbook   = "Trigger events are not reaching Pub/Sub: is the publish-outbox scheduler job running (GET /v1/health), and can publish_outbox publish to trigger-events?"
    }
    steps_oldest_pending = {
      field     = "steps_oldest_pending_seconds"
      title     = "oldest pending step"
      threshold = var.alert_thresholds.pending_step_oldest_seconds
      runbook   = "Steps are created but not claimed: is advance-step-push delivering (its dead-letter hold, advance_step errors, max instances reached)?"
    }
  }
}

resource "google_logging_metric" "event_count" {
  for_each    = local.counted_events
  name        = "onceflow/${each.key}"
  description = "onceflow log lines with event=${each.key}"
  filter      = "${local.log_filter} AND jsonPayload.event=\"${each.key}\""

  metric_descriptor {
    metric_kind = "DELTA"
    value_type  = "INT64"
    unit        = "1"
  }

  depends_on = [google_project_service.enabled]
}

resource "google_logging_metric" "backlog_age" {
  for_each        = local.backlog_ages
  name            = "onceflow/${each.key}_age"
  description     = "Seconds since the ${each.value.title} was created, from the sweep's backlog_age line"
  filter          = "${local.log_filter} AND jsonPayload.event=\"backlog_age\""
  value_extractor = "EXTRACT(jsonPayload.${each.value.field})"

  metric_descriptor {
    metric_kind = "DELTA"
    value_type  = "DISTRIBUTION"
    unit        = "s"
  }

  # 1 s .. about 4.6 days.
  bucket_options {
    exponential_buckets {
      num_finite_buckets = 20
      growth_factor      = 2
      scale              = 1
    }
  }

  depends_on = [google_project_service.enabled]
}

resource "google_monitoring_alert_policy" "event_count" {
  for_each              = local.counted_events
  display_name          = "onceflow: ${each.value.title}"
  combiner              = "OR"
  notification_channels = var.notification_channels
  user_labels           = local.labels

  conditions {
    display_name = "more than ${each.value.threshold} in 10 minutes"
    condition_threshold {
      filter          = "${local.log_filter} AND metric.type=\"logging.googleapis.com/user/${google_logging_metric.event_count[each.key].name}\""
      comparison      = "COMPARISON_GT"
      threshold_value = each.value.threshold
      duration        = "0s"
      aggregations {
        alignment_period     = "600s"
        per_series_aligner   = "ALIGN_SUM"
        cross_series_reducer = "REDUCE_SUM"
      }
    }
  }

  documentation {
    content   = each.value.runbook
    mime_type = "text/markdown"
  }
}

resource "google_monitoring_alert_policy" "backlog_age" {
  for_each              = local.backlog_ages
  display_name          = "onceflow: ${each.value.title} too old"
  combiner              = "OR"
  notification_channels = var.notification_channels
  user_labels           = local.labels

  conditions {
    display_name = "older than ${each.value.threshold} s"
    condition_threshold {
      filter          = "${local.log_filter} AND metric.type=\"logging.googleapis.com/user/${google_logging_metric.backlog_age[each.key].name}\""
      comparison      = "COMPARISON_GT"
      threshold_value = each.value.threshold
      duration        = "0s"
      aggregations {
        alignment_period     = "300s"
        per_series_aligner   = "ALIGN_PERCENTILE_99"
        cross_series_reducer = "REDUCE_MAX"
      }
    }
  }

  # No report at all means the sweep is not running, and then no age alert could fire.
  conditions {
    display_name = "no backlog report for ${var.alert_thresholds.backlog_report_missing_seconds} s"
    condition_absent {
      filter   = "${local.log_filter} AND metric.type=\"logging.googleapis.com/user/${google_logging_metric.backlog_age[each.key].name}\""
      duration = "${var.alert_thresholds.backlog_report_missing_seconds}s"
      aggregations {
        alignment_period     = "300s"
        per_series_aligner   = "ALIGN_PERCENTILE_99"
        cross_series_reducer = "REDUCE_MAX"
      }
    }
  }

  documentation {
    content   = each.value.runbook
    mime_type = "text/markdown"
  }
}

# Messages Pub/Sub gave up on after max_delivery_attempts wait on the hold subscriptions.
resource "google_monitoring_alert_policy" "pubsub_dead_letters" {
  display_name          = "onceflow: Pub/Sub dead letters waiting"
  combiner              = "OR"
  notification_channels = var.notification_channels
  user_labels           = local.labels

  conditions {
    display_name = "more than ${var.alert_thresholds.dead_letters} undelivered on a dead-letter hold"
    condition_threshold {
      filter          = "resource.type=\"pubsub_subscription\" AND metric.type=\"pubsub.googleapis.com/subscription/num_undelivered_messages\" AND (resource.labels.subscription_id=\"${google_pubsub_subscription.trigger_events_dead_letter.name}\" OR resource.labels.subscription_id=\"${google_pubsub_subscription.step_ready_dead_letter.name}\")"
      comparison      = "COMPARISON_GT"
      threshold_value = var.alert_thresholds.dead_letters
      duration        = "0s"
      aggregations {
        alignment_period   = "300s"
        per_series_aligner = "ALIGN_MAX"
      }
    }
  }

  documentation {
    content   = "Pub/Sub could not deliver a message 10 times and moved it to a dead-letter topic. Pull it from the hold subscription (`gcloud pubsub subscriptions pull trigger-events-dead-letter-hold` or `step-ready-dead-letter-hold`): the id it carries names the event or step; the function's logs say why it failed. The sweep re-dispatches lost steps on its own; a trigger event can be published again by clearing its published_at."
    mime_type = "text/markdown"
  }
}
