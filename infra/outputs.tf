output "function_urls" {
  description = "HTTPS URL of every function, by entry point."
  value       = { for name, f in google_cloudfunctions2_function.function : name => f.url }
}

output "webhook_url" {
  description = "Base of the URLs the CRM calls (the only public function): <this>/hubspot/app/<app id> for a HubSpot app (hubspot_app_webhook_urls), <this>/hubspot/<connection id> for a connection of its own. The signature check rebuilds URIs from it."
  value       = local.webhook_public_base_url
}

output "hubspot_app_webhook_urls" {
  description = "Per HubSpot app id (var.hubspot_apps): the target URL to set in the app's webhook settings. The signature check rebuilds the URI HubSpot signed from the same base (PUBLIC_BASE_URL)."
  value       = { for app_id, app in var.hubspot_apps : app_id => "${local.webhook_public_base_url}/hubspot/app/${app_id}" }
}

output "hubspot_oauth_redirect_url" {
  description = "The redirect URL to set in a public HubSpot app's Auth settings: the OAuth callback on the webhook function (the one public function; ops is IAM-gated), also the redirect_uri ops sends (ONCEFLOW_OAUTH_REDIRECT_URL)."
  value       = local.hubspot_oauth_redirect_url
}

output "instance_connection_name" {
  description = "Cloud SQL connection name (INSTANCE_CONNECTION_NAME)."
  value       = google_sql_database_instance.main.connection_name
}

output "db_iam_users" {
  description = "IAM database user of every function that uses the database."
  value       = { for name, u in google_sql_user.function : name => u.name }
}

output "deployer_db_user" {
  description = "IAM database user that applies migrations and infra/grants.sql."
  value       = google_sql_user.deployer.name
}

output "source_object" {
  description = "GCS object holding the deployed archive (named by content hash)."
  value       = "gs://${google_storage_bucket.source.name}/${google_storage_bucket_object.bundle.name}"
}

output "bundle_hash" {
  description = "Content hash of the deployed file selection; `python -m devstack.bundle` prints the same value."
  value       = local.bundle_hash
}

output "topics" {
  description = "Pub/Sub topics, with their dead-letter topics."
  value = {
    trigger_events             = google_pubsub_topic.trigger_events.id
    step_ready                 = google_pubsub_topic.step_ready.id
    trigger_events_dead_letter = google_pubsub_topic.trigger_events_dead_letter.id
    step_ready_dead_letter     = google_pubsub_topic.step_ready_dead_letter.id
  }
}

output "worker_pool" {
  description = "Cloud Build private pool that can reach the database (_WORKER_POOL)."
  value       = google_cloudbuild_worker_pool.deploy.id
}

output "db_connection_budget" {
  description = "Connections the functions may open at full scale-out, and the limit they must stay under."
  value       = terraform_data.db_connection_budget.output
}

output "ops_page_url" {
  description = "The ops page for people's browsers, behind Identity-Aware Proxy (iap.tf); empty without var.ops_domain."
  value       = local.ops_behind_iap ? "https://${var.ops_domain}/ui" : ""
}

output "ops_page_ip" {
  description = "The address to point var.ops_domain's A record at (the managed certificate is issued once it resolves); empty without var.ops_domain."
  value       = local.ops_behind_iap ? google_compute_global_address.ops[0].address : ""
}
