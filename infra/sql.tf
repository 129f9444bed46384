# Cloud SQL for PostgreSQL: private IP only, IAM database authentication, no passwords.
#
# Every function connects as its own service account (google_sql_user.function) through
# cloud-sql-python-connector (shared/core/db.py): IAM auth, private IP, lazy refresh. Those users
# get table privileges from infra/grants.sql, which Cloud Build runs after each apply.

resource "google_sql_database_instance" "main" {
  name                = var.sql_instance_name
  region              = var.region
  database_version    = "POSTGRES_16"
  deletion_protection = var.deletion_protection

  settings {
    tier              = var.sql_tier
    user_labels       = local.labels
    availability_type = "ZONAL"
    edition           = "ENTERPRISE"

    ip_configuration {
      ipv4_enabled                                  = false
      private_network                               = google_compute_network.main.id
      enable_private_path_for_google_cloud_services = true
    }

    database_flags {
      name  = "cloudsql.iam_authentication"
      value = "on"
    }

    # Authoritative: the connection budget check in functions.tf compares against this.
    database_flags {
      name  = "max_connections"
      value = tostring(var.db_max_connections)
    }

    backup_configuration {
      enabled                        = true
      point_in_time_recovery_enabled = true
      start_time                     = "03:00"
    }

    insights_config {
      query_insights_enabled = true
    }
  }

  depends_on = [google_service_networking_connection.private_services]
}

resource "google_sql_database" "onceflow" {
  name     = var.database_name
  instance = google_sql_database_instance.main.name
}

# IAM database users are named like the service account's email without
# ".gserviceaccount.com".
resource "google_sql_user" "function" {
  for_each = { for name, f in local.functions : name => f if f.uses_database }
  name     = trimsuffix(google_service_account.function[each.key].email, ".gserviceaccount.com")
  instance = google_sql_database_instance.main.name
  type     = "CLOUD_IAM_SERVICE_ACCOUNT"
}

# The deployer applies migrations, so it owns the tables and runs infra/grants.sql.
resource "google_sql_user" "deployer" {
  name     = trimsuffix(google_service_account.deployer.email, ".gserviceaccount.com")
  instance = google_sql_database_instance.main.name
  type     = "CLOUD_IAM_SERVICE_ACCOUNT"
}
