# APIs the bundle needs. disable_on_destroy is off: turning an API off can break other things
# in a shared project, and re-enabling is cheap.
locals {
  apis = [
    "artifactregistry.googleapis.com",
    "cloudbuild.googleapis.com",
    "cloudfunctions.googleapis.com",
    # Project IAM bindings (google_project_iam_member) go through this API; a new project
    # does not always have it on, and the first apply would fail half way.
    "cloudresourcemanager.googleapis.com",
    "cloudscheduler.googleapis.com",
    "compute.googleapis.com",
    "eventarc.googleapis.com",
    "iam.googleapis.com",
    # Identity-Aware Proxy in front of the ops page (iap.tf, when var.ops_domain is set).
    "iap.googleapis.com",
    "logging.googleapis.com",
    "monitoring.googleapis.com",
    "pubsub.googleapis.com",
    "run.googleapis.com",
    "secretmanager.googleapis.com",
    "servicenetworking.googleapis.com",
    "sqladmin.googleapis.com",
    "vpcaccess.googleapis.com",
  ]
}

resource "google_project_service" "enabled" {
  for_each           = toset(local.apis)
  service            = each.value
  disable_on_destroy = false
}

data "google_project" "this" {
  project_id = var.project_id
}

# On every resource that takes labels: billing reports and `gcloud ... --filter=labels.app=`
# find the whole deployment.
locals {
  labels = merge({ app = "onceflow", managed-by = "terraform" }, var.labels)
}
