# The deploy archive: one zip of the source root, uploaded once per content hash.
#
# The file selection is written ONCE, here. devstack/bundle.py reads `bundle_patterns` and
# `bundle_excludes` from this file with python-hcl2 and applies the same fileset() semantics,
# and tests/test_archive.py serves every entry point from that archive in a clean environment,
# so what the tests prove importable is what Cloud Build deploys.
#
# main.py sits at the archive root beside shared/ and functions/: the Python buildpack and
# functions-framework put only the source file's folder on sys.path, so both packages import
# as top-level packages with no PYTHONPATH help. requirements.txt must be at the root too.
locals {
  bundle_patterns = ["main.py", "requirements.txt", "functions/**/*.py", "shared/**"]
  bundle_excludes = ["**/__pycache__/**", "**/*.pyc"]

  source_root = "${path.module}/.."

  bundle_files = sort(tolist(setsubtract(
    toset(flatten([for p in local.bundle_patterns : fileset(local.source_root, p)])),
    toset(flatten([for p in local.bundle_excludes : fileset(local.source_root, p)])),
  )))

  # A hash of names and contents, not of the zip bytes: zip metadata (timestamps, ordering)
  # must not redeploy seven functions, and any change to a selected file must.
  # devstack/bundle.py computes the same value (content_hash) for the archive it builds.
  bundle_hash = sha256(join("\n", [
    for f in local.bundle_files : "${f} ${filesha256("${local.source_root}/${f}")}"
  ]))
}

data "archive_file" "bundle" {
  type        = "zip"
  output_path = "${path.module}/.terraform/bundle/onceflow-${local.bundle_hash}.zip"

  dynamic "source" {
    for_each = toset(local.bundle_files)
    content {
      filename = source.value
      content  = file("${local.source_root}/${source.value}")
    }
  }
}

resource "google_storage_bucket" "source" {
  name                        = "${var.project_id}-onceflow-source"
  location                    = var.region
  uniform_bucket_level_access = true
  public_access_prevention    = "enforced"
  force_destroy               = true
  labels                      = local.labels

  # Every code change uploads a new onceflow-<hash>.zip and every build leaves its artifact
  # under builds/: without this rule the bucket only grows. A deleted archive that is still
  # the deployed one is uploaded again by the next apply under the same name, which changes no
  # function (their build_config names the object, not its generation).
  lifecycle_rule {
    condition {
      age            = var.source_retention_days
      matches_prefix = ["onceflow-", "builds/"]
    }
    action {
      type = "Delete"
    }
  }

  depends_on = [google_project_service.enabled]
}

# Named by content hash: a code change is a new object, which changes every function's
# build_config.source and so redeploys them; an unchanged tree plans no change at all.
resource "google_storage_bucket_object" "bundle" {
  name   = "onceflow-${substr(local.bundle_hash, 0, 24)}.zip"
  bucket = google_storage_bucket.source.name
  source = data.archive_file.bundle.output_path
}
