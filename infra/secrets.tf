# Secret containers only. Values never pass through Terraform (they would land in state):
# operators add versions with `gcloud secrets versions add`, and var.secrets pins the version
# each function reads through secret_environment_variables.

resource "google_secret_manager_secret" "secret" {
  for_each  = var.secrets
  secret_id = each.key
  labels    = local.labels

  replication {
    auto {}
  }

  depends_on = [google_project_service.enabled]
}
