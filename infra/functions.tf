# The seven Cloud Run functions (gen2), all built from the one archive in bundle.tf.
#
# `local.functions` mirrors shared/deployables.py (DEPLOYABLES) row for row; tests/test_infra.py
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
locals {
  functions = {
    webhook = {
      entry_point     = "webhook"
      trigger         = "http"
      public          = true
      uses_database   = true
      timeout_seconds = 30
      memory          = "256Mi"
    }
    drain_inbox = {
      entry_point     = "drain_inbox"
      trigger         = "schedule"
      public          = false
      uses_database   = true
      timeout_seconds = 60
      memory          = "256Mi"
    }
    publish_outbox = {
      entry_point     = "publish_outbox"
      trigger         = "schedule"
      public          = false
      uses_database   = true
      timeout_seconds = 60
      memory          = "256Mi"
    }
    admit_event = {
      entry_point     = "admit_event"
      trigger         = "pubsub"
      public          = false
      uses_database   = true
      timeout_seconds = 120
      memory          = "256Mi"
    }
    advance_step = {
      entry_point     = "advance_step"
      trigger         = "pubsub"
      public          = false
      uses_database   = true
      timeout_seconds = 300
      memory          = "512Mi"
    }
    sweep = {
      entry_point     = "sweep"
      trigger         = "schedule"
      public          = false
      uses_database   = true
      timeout_seconds = 60
      memory          = "256Mi"
    }
    ops = {
      entry_point     = "ops"
      trigger         = "http"
      public          = false
      uses_database   = true
      timeout_seconds = 60
      memory          = "256Mi"
    }
  }

  # Connections the functions can open at full scale-out: every instance fills its pool.
  db_connection_demand = sum([
    for name, f in local.functions : lookup(var.max_instances, name, 0) * var.db_pool_size if f.uses_database
  ])
  db_connection_limit = var.db_max_connections - var.db_connection_reserve
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
      error_message = "Connection budget exceeded: sum(max_instances x db_pool_size) over the database-using functions must stay below db_max_connections - db_connection_reserve. Lower max_instances or db_pool_size, or raise db_max_connections with a bigger sql_tier."
    }
    precondition {
      condition     = length(setsubtract(keys(local.functions), keys(var.max_instances))) == 0
      error_message = "max_instances needs an entry for every function."
    }
  }
}

resource "google_cloudfunctions2_function" "function" {
  for_each = local.functions

  name        = replace(each.key, "_", "-")
  location    = var.region
  description = "onceflow ${each.key} (${each.value.trigger})"

  build_config {
    runtime     = "python311"
    entry_point = each.value.entry_point
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
    min_instance_count = 0
    # One request per instance: the pool (db_pool_size) is sized for one invocation's
    # transactions, and the connection budget assumes it.
    max_instance_request_concurrency = 1
    available_memory                 = each.value.memory
    timeout_seconds                  = each.value.timeout_seconds
    # IAM is the gate (iam.tf): only webhook grants allUsers. Pub/Sub push and Cloud Scheduler
    # reach the run.app URL from Google's front end, so ingress stays ALLOW_ALL.
    ingress_settings               = "ALLOW_ALL"
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
      DB_POOL_SIZE             = tostring(var.db_pool_size)
      LOG_LEVEL                = var.log_level
    }

    dynamic "secret_environment_variables" {
      for_each = { for id, s in var.secrets : id => s if contains(s.functions, each.key) }
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
    google_secret_manager_secret_iam_member.accessor,
    google_project_iam_member.function_sql,
    google_sql_user.function,
  ]
}
