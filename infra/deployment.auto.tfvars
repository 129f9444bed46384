# What this deployment declares, committed: Terraform reads every *.auto.tfvars in infra/ on
# each plan, from a workstation and from the pipeline alike (cloudbuild.yaml's plan passes only
# the five -var values its substitutions bind: project_id, region, sql_instance_name,
# database_name, deployer_service_account). A value kept only in a local tfvars file would be
# missing from the next pipeline plan, which would then delete what it declared (an app's
# secrets, the IAP load balancer, alert channels). Put every choice here, review it, commit it.
#
# Examples (uncomment and edit):
#
# hubspot_apps = {
#   "123" = { kind = "public", versions = { client_secret = "1", client_id = "1", developer_key = "1" } }
# }
# ops_invokers          = ["group:oncall@example.com"]
# ops_domain            = "onceflow-ops.example.com"
# ops_iap_members       = ["group:sales-ops@example.com"]
# notification_channels = ["projects/P/notificationChannels/N"]
