# Topics and OUR OWN push subscriptions (see functions.tf for why there is no event_trigger).
#
# Messages carry ids, never payloads, so redelivery is cheap; the functions make a redelivery
# harmless (claims, unique keys). The retry policy spaces redeliveries of a failing message and
# the dead-letter policy stops them: after max_delivery_attempts the message moves to the
# dead-letter topic with its delivery count, instead of being retried forever.
#
# The local stack (devstack) creates the same topics and subscriptions on the Pub/Sub emulator
# from these resources, so keep names and policies as literals.
#
# Expiry: a subscription without `expiration_policy` is deleted after 31 days without
# activity. For a dead-letter hold that is the normal state, and once it is gone later dead
# letters land on a topic nobody reads. Every subscription here sets `ttl = ""` (never); one
# that may expire must say why in `local.subscriptions_allowed_to_expire` (tests/test_infra.py).
locals {
  subscriptions_allowed_to_expire = {}
}

resource "google_pubsub_topic" "trigger_events" {
  name                       = "trigger-events"
  message_retention_duration = "86400s"
  labels                     = local.labels
  depends_on                 = [google_project_service.enabled]
}

resource "google_pubsub_topic" "step_ready" {
  name                       = "step-ready"
  message_retention_duration = "86400s"
  labels                     = local.labels
  depends_on                 = [google_project_service.enabled]
}

resource "google_pubsub_topic" "trigger_events_dead_letter" {
  name                       = "trigger-events-dead-letter"
  message_retention_duration = "604800s"
  labels                     = local.labels
  depends_on                 = [google_project_service.enabled]
}

resource "google_pubsub_topic" "step_ready_dead_letter" {
  name                       = "step-ready-dead-letter"
  message_retention_duration = "604800s"
  labels                     = local.labels
  depends_on                 = [google_project_service.enabled]
}

# Dead letters are kept on a pull subscription so an operator can read them (7 days).
resource "google_pubsub_subscription" "trigger_events_dead_letter" {
  name                       = "trigger-events-dead-letter-hold"
  topic                      = google_pubsub_topic.trigger_events_dead_letter.id
  message_retention_duration = "604800s"
  ack_deadline_seconds       = 60
  labels                     = local.labels

  expiration_policy {
    ttl = "" # never: an idle dead-letter hold is the normal, healthy state
  }
}

resource "google_pubsub_subscription" "step_ready_dead_letter" {
  name                       = "step-ready-dead-letter-hold"
  topic                      = google_pubsub_topic.step_ready_dead_letter.id
  message_retention_duration = "604800s"
  ack_deadline_seconds       = 60
  labels                     = local.labels

  expiration_policy {
    ttl = "" # never: an idle dead-letter hold is the normal, healthy state
  }
}

# Push endpoints and OIDC audiences are the functions' run.app URLs (service_config[0].uri),
# not their cloudfunctions.net `url`: Cloud Run counts Pub/Sub push as internal traffic only
# when it calls the default run.app URL, and admit_event/advance_step are ALLOW_INTERNAL_ONLY.
#
# One push subscription per Pub/Sub-fed function, keyed by the function. For push, the ack
# deadline is the request timeout: it must cover the function's timeout_seconds or Pub/Sub
# redelivers a message still being handled.
locals {
  push_subscriptions = {
    # trigger-events -> admit_event (timeout_seconds 120).
    admit_event = {
      name                 = "admit-event-push"
      topic                = google_pubsub_topic.trigger_events.id
      dead_letter_topic    = google_pubsub_topic.trigger_events_dead_letter.id
      ack_deadline_seconds = 120
    }
    # step-ready -> advance_step (timeout_seconds 300).
    advance_step = {
      name                 = "advance-step-push"
      topic                = google_pubsub_topic.step_ready.id
      dead_letter_topic    = google_pubsub_topic.step_ready_dead_letter.id
      ack_deadline_seconds = 300
    }
  }
}

resource "google_pubsub_subscription" "push" {
  for_each = local.push_subscriptions

  name                 = each.value.name
  topic                = each.value.topic
  ack_deadline_seconds = each.value.ack_deadline_seconds

  push_config {
    push_endpoint = google_cloudfunctions2_function.function[each.key].service_config[0].uri
    oidc_token {
      service_account_email = google_service_account.pubsub_push.email
      audience              = google_cloudfunctions2_function.function[each.key].service_config[0].uri
    }
  }

  retry_policy {
    minimum_backoff = "10s"
    maximum_backoff = "600s"
  }

  dead_letter_policy {
    dead_letter_topic     = each.value.dead_letter_topic
    max_delivery_attempts = 10
  }

  expiration_policy {
    ttl = "" # never expire for inactivity
  }

  labels = local.labels

  depends_on = [
    google_cloud_run_service_iam_member.pubsub_push_invoker,
    google_pubsub_topic_iam_member.dead_letter_publisher,
  ]
}

# The push subscriptions were two resources before: a deployed project keeps them.
moved {
  from = google_pubsub_subscription.admit_event_push
  to   = google_pubsub_subscription.push["admit_event"]
}

moved {
  from = google_pubsub_subscription.advance_step_push
  to   = google_pubsub_subscription.push["advance_step"]
}
