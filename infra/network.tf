# A private network for Cloud SQL's private IP, the functions' VPC connector and the Cloud
# Build worker pool that applies migrations (the default Cloud Build pool cannot reach a
# private IP).

resource "google_compute_network" "main" {
  name                    = var.network_name
  auto_create_subnetworks = false
  depends_on              = [google_project_service.enabled]
}

# Private services access: one range peered to Google's service producer network, shared by
# Cloud SQL and the Cloud Build private pool.
resource "google_compute_global_address" "private_services" {
  name          = "${var.network_name}-private-services"
  purpose       = "VPC_PEERING"
  address_type  = "INTERNAL"
  prefix_length = 20
  network       = google_compute_network.main.id
}

resource "google_service_networking_connection" "private_services" {
  network                 = google_compute_network.main.id
  service                 = "servicenetworking.googleapis.com"
  reserved_peering_ranges = [google_compute_global_address.private_services.name]
}

resource "google_vpc_access_connector" "functions" {
  name          = "onceflow-functions"
  region        = var.region
  network       = google_compute_network.main.name
  ip_cidr_range = var.connector_cidr
  min_instances = 2
  max_instances = 3
  machine_type  = "e2-micro"
  depends_on    = [google_project_service.enabled]
}

resource "google_cloudbuild_worker_pool" "deploy" {
  name     = "onceflow-deploy"
  location = var.region

  worker_config {
    machine_type = "e2-standard-2"
    disk_size_gb = 100
  }

  network_config {
    peered_network = google_compute_network.main.id
  }

  depends_on = [google_service_networking_connection.private_services]
}
