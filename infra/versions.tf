# Provider pins. The google provider is held to 6.x: the attributes used here
# (cloudfunctions2 service_config/build_config, pubsub dead_letter_policy, cloud scheduler
# oidc_token) are stable across that major version.
terraform {
  required_version = ">= 1.5"

  required_providers {
    google = {
      source  = "hashicorp/google"
      version = "~> 6.0"
    }
    archive = {
      source  = "hashicorp/archive"
      version = "~> 2.4"
    }
  }

  # State lives in a GCS bucket created once by hand (see infra/README.md); Cloud Build passes
  # `-backend-config=bucket=...` so no project-specific name is committed here.
  backend "gcs" {}
}

provider "google" {
  project = var.project_id
  region  = var.region
}
