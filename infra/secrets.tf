# Secret containers only. Values never pass through Terraform (they would land in state):
# operators add versions with `gcloud secrets versions add`, and var.secrets / var.hubspot_apps
# pin the version each function reads through secret_environment_variables.

locals {
  # Who reads each secret of a HubSpot app, by the app's kind. shared/accounts/provider_apps.py
  # (APP_SECRET_READERS) says the same; tests/test_infra.py fails when they differ. The client
  # secret keys the webhook signatures and, for a public app, the OAuth code exchange (with the
  # client id) done by webhook, which serves HubSpot's redirect back from an install (ops is
  # IAM-gated, a browser can't reach it), and the token refresh done by the functions that use
  # a connection's token; the developer key is what the subscriptions API takes (sweep hourly,
  # ops on activation).
  hubspot_app_secret_readers = {
    public = {
      client_secret = ["webhook", "advance_step", "sweep", "ops"]
      client_id     = ["webhook", "advance_step", "sweep", "ops"]
      developer_key = ["sweep", "ops"]
    }
    private = {
      client_secret = ["webhook"]
    }
  }

  hubspot_app_secrets = merge({}, [
    for app_id, app in var.hubspot_apps : {
      for name, readers in local.hubspot_app_secret_readers[app.kind] :
      "onceflow-hubspot-app-${app_id}-${replace(name, "_", "-")}" => {
        env_var   = "HUBSPOT_APP_${app_id}_${upper(name)}"
        version   = app.versions[name]
        functions = readers
      }
    }
  ]...)

  # Every secret of the deployment, keyed by secret id: the fixed ones and the apps' ones.
  secrets = merge(var.secrets, local.hubspot_app_secrets)
}

resource "google_secret_manager_secret" "secret" {
  for_each  = local.secrets
  secret_id = each.key
  labels    = local.labels

  replication {
    auto {}
  }

  depends_on = [google_project_service.enabled]
}
