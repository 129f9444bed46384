variable "project_id" {
  description = "Google Cloud project that hosts onceflow."
  type        = string
}

variable "region" {
  description = "Region for the functions, Cloud SQL, the VPC connector and the scheduler jobs."
  type        = string
  default     = "europe-west1"
}

variable "sql_instance_name" {
  description = "Cloud SQL instance name. cloudbuild.yaml builds the connection name from it (_SQL_INSTANCE) to run migrations before `terraform apply`, so keep the two equal."
  type        = string
  default     = "onceflow"
}

variable "sql_tier" {
  description = "Cloud SQL machine tier."
  type        = string
  default     = "db-custom-1-3840"
}

variable "database_name" {
  description = "Postgres database that holds every onceflow table."
  type        = string
  default     = "onceflow"
}

variable "deletion_protection" {
  description = "Protect the Cloud SQL instance from `terraform destroy`. All onceflow state is in it."
  type        = bool
  default     = true
}

variable "db_max_connections" {
  description = "Postgres max_connections, set as a database flag on the instance. The connection budget check compares the functions' demand against it."
  type        = number
  default     = 100
}

variable "db_connection_reserve" {
  description = "Connections kept free for Cloud SQL's own maintenance, the migration runner and a human with psql."
  type        = number
  default     = 10
}

variable "request_concurrency" {
  description = "Requests one instance of each function serves at once (max_instance_request_concurrency, and THREADS for functions-framework's gunicorn). Each instance's database pool is this plus one (DB_POOL_SIZE: a connection per request thread and one for the process's background thread, shared/core/db.py pool_size_for), and the connection budget counts it. Defaults mirror shared/core/deployables.py (tests/test_infra.py checks them); the scheduled functions keep 1."
  type        = map(number)
  default = {
    webhook        = 8
    drain_inbox    = 1
    publish_outbox = 1
    admit_event    = 8
    advance_step   = 8
    sweep          = 1
    ops            = 8
  }

  validation {
    # Cloud Run's limit; above 1 also needs a whole vCPU, which every function has (cpu = "1").
    condition     = alltrue([for n in values(var.request_concurrency) : n >= 1 && n <= 1000])
    error_message = "Every request_concurrency value must be between 1 and 1000."
  }
}

variable "max_instances" {
  description = "Maximum instance count per function. sum(max_instances x (request_concurrency + 1)) over the functions that use the database must stay below db_max_connections - db_connection_reserve, or the plan fails."
  type        = map(number)
  # Each instance serves request_concurrency requests, so few instances carry the load that
  # one-request instances needed many for: 2 x 8 webhook requests at once (16, was 10 x 1),
  # 2 x 8 admissions (16, was 10), 4 x 8 steps (32, was 15). Demand at these defaults:
  # 9 x (2 + 2 + 4 + 1) + 2 x 3 = 87 of the 90 connections db-custom-1-3840 leaves
  # (100 - 10 reserve).
  default = {
    webhook        = 2
    drain_inbox    = 1
    publish_outbox = 1
    admit_event    = 2
    advance_step   = 4
    sweep          = 1
    ops            = 1
  }

  validation {
    condition     = alltrue([for n in values(var.max_instances) : n >= 1])
    error_message = "Every max_instances value must be at least 1."
  }
}

variable "secrets" {
  description = <<-EOT
    Secret Manager secrets handed to functions as environment variables, keyed by secret id.
    Terraform creates the secret containers; operators add the values with
    `gcloud secrets versions add ID --data-file=-` and pin the version number here, so a
    rotated secret reaches the functions only through a reviewed plan.
  EOT
  type = map(object({
    env_var   = string
    version   = string
    functions = list(string)
  }))
  default = {
    "onceflow-hubspot-client-secret" = {
      env_var   = "HUBSPOT_CLIENT_SECRET"
      version   = "1"
      functions = ["webhook"]
    }
    "onceflow-crm-credentials" = {
      env_var   = "CRM_CREDENTIALS"
      version   = "1"
      functions = ["advance_step", "sweep", "ops"]
    }
    "onceflow-tenant-signing-secrets" = {
      env_var   = "TENANT_SIGNING_SECRETS"
      version   = "1"
      functions = ["advance_step"]
    }
    # The one-time bootstrap (shared/ops/auth.py, BOOTSTRAP_SECRET_ENV): POST /v1/bootstrap on
    # ops with it as the bearer token mints the deployment's first admin ops token, once ever;
    # afterwards it opens nothing. At least 32 random characters. (There is no token pepper:
    # ops tokens are 256 random bits, so their SHA-256 can't be guessed back without one.)
    "onceflow-ops-bootstrap" = {
      env_var   = "ONCEFLOW_OPS_BOOTSTRAP_SECRET"
      version   = "1"
      functions = ["ops"]
    }
    # Signs approval links (shared/steps/link_signing.py, SECRET_ENV): without it no link can be
    # made or used. At least 16 random characters. ops makes links; sweep mails them to the
    # approvers of an approval with `channels.email`; webhook, the public function, serves them
    # to approvers' browsers.
    "onceflow-approval-link-secret" = {
      env_var   = "ONCEFLOW_APPROVAL_LINK_SECRET"
      version   = "1"
      functions = ["ops", "webhook", "sweep"]
    }
    # Seals OAuth refresh and access tokens at rest (shared/accounts/oauth_tokens.py, TOKEN_KEK_ENV):
    # 32 random bytes, base64. Read by webhook, which seals the grant at an install's callback,
    # and the functions that use or refresh a connection's token (shared/core/deployables.py,
    # OAUTH_CLIENT_USERS).
    "onceflow-token-kek" = {
      env_var   = "ONCEFLOW_TOKEN_KEK"
      version   = "1"
      functions = ["webhook", "advance_step", "sweep", "ops"]
    }
  }

  validation {
    condition     = alltrue([for s in values(var.secrets) : can(regex("^[1-9][0-9]*$", s.version))])
    error_message = "Pin every secret to a version number; \"latest\" would let a rotation change a running function without a plan."
  }

  validation {
    condition = alltrue(flatten([
      for s in values(var.secrets) : [
        for f in s.functions : contains(["webhook", "drain_inbox", "publish_outbox", "admit_event", "advance_step", "sweep", "ops"], f)
      ]
    ]))
    error_message = "secrets[*].functions may only name the seven onceflow functions."
  }
}

variable "ops_invokers" {
  description = "IAM members allowed to call the ops function (e.g. group:oncall@example.com). The function checks an ops token as well."
  type        = list(string)
  default     = []

  validation {
    condition     = alltrue([for m in var.ops_invokers : !contains(["allUsers", "allAuthenticatedUsers"], m)])
    error_message = "ops is IAM-only: allUsers and allAuthenticatedUsers are refused."
  }
}

variable "ops_domain" {
  description = "A domain name for the ops page behind Identity-Aware Proxy (iap.tf): an HTTPS load balancer with a Google-managed certificate for it, whose address is output ops_page_ip (point the domain's A record there). Empty: no load balancer; the ops function's own URL stays IAM-only, for the CLI."
  type        = string
  default     = ""
}

variable "ops_iap_members" {
  description = "Who may pass Identity-Aware Proxy to the ops page (user:, group:, domain:). They still sign in to onceflow with an ops token behind it."
  type        = list(string)
  default     = []

  validation {
    condition     = alltrue([for m in var.ops_iap_members : !contains(["allUsers", "allAuthenticatedUsers"], m)])
    error_message = "ops is for named people: allUsers and allAuthenticatedUsers are refused."
  }
}

variable "log_level" {
  description = "LOG_LEVEL for every function."
  type        = string
  default     = "INFO"
}

variable "tracing" {
  description = "ONCEFLOW_TRACING for every function: off (no SDK loaded) or gcp (spans to Cloud Trace, metrics to Cloud Monitoring)."
  type        = string
  default     = "off"
  validation {
    condition     = contains(["off", "gcp"], var.tracing)
    error_message = "tracing is off or gcp (console is for the local stack)."
  }
}

variable "tracing_sample_ratio" {
  description = "ONCEFLOW_TRACING_SAMPLE_RATIO: the share of events traced when tracing is gcp (each whole or not at all)."
  type        = number
  default     = 1
  validation {
    condition     = var.tracing_sample_ratio >= 0 && var.tracing_sample_ratio <= 1
    error_message = "tracing_sample_ratio is from 0 to 1."
  }
}

variable "network_name" {
  description = "VPC network created for the private Cloud SQL address, the connector and the Cloud Build pool."
  type        = string
  default     = "onceflow"
}

variable "connector_cidr" {
  description = "An unused /28 for the Serverless VPC Access connector."
  type        = string
  default     = "10.8.0.0/28"
}

variable "deployer_service_account" {
  description = "Account id of the service account the Cloud Build trigger runs as (created here; it also becomes the IAM database user that applies migrations)."
  type        = string
  default     = "onceflow-deployer"
}

variable "webhook_min_instances" {
  description = "Warm instances kept for webhook. 0 (scale to zero): a cold webhook spends about 0.8 s of CPU from process start to app built (measured, infra/README.md), well inside HubSpot's 5 s delivery timeout, and a delivery that still times out is retried by HubSpot and stored once (the drain dedupes on the event id); 1 keeps one instance warm for about $65 a month."
  type        = number
  default     = 0

  validation {
    condition     = var.webhook_min_instances >= 0 && var.webhook_min_instances <= 10
    error_message = "webhook_min_instances must be between 0 and 10."
  }
}

variable "labels" {
  description = "Extra labels for every labelled resource (added to app=onceflow, managed-by=terraform)."
  type        = map(string)
  default     = {}
}

variable "source_retention_days" {
  description = "Days a source archive (onceflow-<hash>.zip) and a Cloud Build artifact are kept in the source bucket. The deployed archive is uploaded again by the next apply if it was deleted, which redeploys nothing (same name, same content)."
  type        = number
  default     = 90

  validation {
    condition     = var.source_retention_days >= 7
    error_message = "Keep archives at least 7 days, so a rollback to last week's build is possible."
  }
}

variable "notification_channels" {
  description = "Cloud Monitoring notification channel ids (projects/P/notificationChannels/N) every onceflow alert pages. Empty: alerts open incidents in the console only."
  type        = list(string)
  default     = []
}

variable "alert_thresholds" {
  description = "When the alerts in monitoring.tf fire. Counts are per 10-minute window; ages are seconds, compared with the 99th percentile of the sweep's backlog reports over 5 minutes."
  type = object({
    failed_runs                    = optional(number, 5)
    breaker_trips                  = optional(number, 0)
    dead_letters                   = optional(number, 0)
    lease_expiries                 = optional(number, 0)
    outbox_oldest_seconds          = optional(number, 300)
    inbox_oldest_seconds           = optional(number, 300)
    pending_step_oldest_seconds    = optional(number, 600)
    backlog_report_missing_seconds = optional(number, 900)
  })
  default = {}
}

variable "webhook_public_base_url" {
  description = "The URL the CRM calls, up to and without /hubspot/<connection id> (PUBLIC_BASE_URL). Empty: the webhook function's own https://REGION-PROJECT.cloudfunctions.net/webhook. Set it when a load balancer or custom domain fronts the function."
  type        = string
  default     = ""
}

variable "hubspot_apps" {
  description = <<-EOT
    HubSpot apps whose webhooks arrive at <webhook_url>/hubspot/app/<app id> (output
    hubspot_app_webhook_urls), keyed by HubSpot app id. For each, secrets.tf creates one Secret
    Manager secret per secret the app has, onceflow-hubspot-app-<app id>-<name>, handed to the
    functions that read it as HUBSPOT_APP_<app id>_<NAME> (shared/accounts/provider_apps.py,
    secret_env). A public app has client_secret, client_id and developer_key; a private app
    only client_secret. As with var.secrets, operators add the values with
    `gcloud secrets versions add` and pin each version number here.
  EOT
  type = map(object({
    kind     = optional(string, "public")
    versions = map(string)
  }))
  default = {}

  validation {
    condition     = alltrue([for id in keys(var.hubspot_apps) : can(regex("^[1-9][0-9]{0,19}$", id))])
    error_message = "hubspot_apps is keyed by the numeric HubSpot app id."
  }

  validation {
    condition     = alltrue([for a in values(var.hubspot_apps) : contains(["public", "private"], a.kind)])
    error_message = "hubspot_apps[*].kind is public or private."
  }

  validation {
    condition = alltrue([
      for a in values(var.hubspot_apps) : sort(keys(a.versions)) == (
        a.kind == "public" ? ["client_id", "client_secret", "developer_key"] : ["client_secret"]
      )
    ])
    error_message = "hubspot_apps[*].versions names client_id, client_secret and developer_key for a public app, only client_secret for a private one."
  }

  validation {
    condition = alltrue(flatten([
      for a in values(var.hubspot_apps) : [for v in values(a.versions) : can(regex("^[1-9][0-9]*$", v))]
    ]))
    error_message = "Pin every app secret to a version number; \"latest\" would let a rotation change a running function without a plan."
  }
}
