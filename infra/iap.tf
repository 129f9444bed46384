# The ops page for people's browsers: an external HTTPS load balancer with Identity-Aware Proxy
# in front of the ops function, created when var.ops_domain is set.
#
# Why: ops is IAM-gated (Cloud Run IAM, var.ops_invokers), which the CLI satisfies with
# `gcloud auth print-identity-token`, but a browser sends no Google identity token, so the
# page, the approvals list and the install start can't be opened at the function's URL. IAP
# signs people in with their Google account at the load balancer and lets through only
# var.ops_iap_members; behind it onceflow's own sign-in (an ops token, tenant-scoped) still
# decides what each person sees. The function's own URL stays IAM-only for the CLI.
#
# Approvers who are not members (anyone an approval names) don't come this way: their signed
# links are served by the public webhook function (functions/webhook.py).
#
# IAP uses a Google-managed OAuth client (iap { enabled = true } without a client id), which
# needs no consent-screen setup for users of the project's organisation; for external users
# create an OAuth client and set oauth2_client_id/secret instead (IAP docs, "Enabling IAP for
# Cloud Run").
locals {
  ops_behind_iap = var.ops_domain != ""
}

resource "google_compute_region_network_endpoint_group" "ops" {
  count                 = local.ops_behind_iap ? 1 : 0
  name                  = "onceflow-ops"
  region                = var.region
  network_endpoint_type = "SERVERLESS"
  # A gen2 function is a Cloud Run service of the same name.
  cloud_run {
    service = google_cloudfunctions2_function.function["ops"].name
  }
}

resource "google_compute_backend_service" "ops" {
  count                 = local.ops_behind_iap ? 1 : 0
  name                  = "onceflow-ops"
  protocol              = "HTTPS"
  load_balancing_scheme = "EXTERNAL_MANAGED"

  backend {
    group = google_compute_region_network_endpoint_group.ops[0].id
  }

  iap {
    enabled = true
  }

  depends_on = [google_project_service.enabled]
}

resource "google_compute_url_map" "ops" {
  count           = local.ops_behind_iap ? 1 : 0
  name            = "onceflow-ops"
  default_service = google_compute_backend_service.ops[0].id
}

resource "google_compute_managed_ssl_certificate" "ops" {
  count = local.ops_behind_iap ? 1 : 0
  name  = "onceflow-ops"

  managed {
    domains = [var.ops_domain]
  }
}

resource "google_compute_target_https_proxy" "ops" {
  count            = local.ops_behind_iap ? 1 : 0
  name             = "onceflow-ops"
  url_map          = google_compute_url_map.ops[0].id
  ssl_certificates = [google_compute_managed_ssl_certificate.ops[0].id]
}

resource "google_compute_global_address" "ops" {
  count = local.ops_behind_iap ? 1 : 0
  name  = "onceflow-ops"
}

resource "google_compute_global_forwarding_rule" "ops" {
  count                 = local.ops_behind_iap ? 1 : 0
  name                  = "onceflow-ops"
  target                = google_compute_target_https_proxy.ops[0].id
  ip_address            = google_compute_global_address.ops[0].id
  port_range            = "443"
  load_balancing_scheme = "EXTERNAL_MANAGED"
}

# Who passes the proxy.
resource "google_iap_web_backend_service_iam_member" "ops" {
  for_each            = local.ops_behind_iap ? toset(var.ops_iap_members) : toset([])
  web_backend_service = google_compute_backend_service.ops[0].name
  role                = "roles/iap.httpsResourceAccessor"
  member              = each.value
}

# The proxy calls the function as IAP's service agent, which needs the invoker role (ops is
# not public: Cloud Run IAM still checks the proxy's token).
resource "google_cloud_run_service_iam_member" "ops_iap_invoker" {
  count    = local.ops_behind_iap ? 1 : 0
  location = var.region
  service  = google_cloudfunctions2_function.function["ops"].name
  role     = "roles/run.invoker"
  member   = "serviceAccount:service-${data.google_project.this.number}@gcp-sa-iap.iam.gserviceaccount.com"
}
