"""Accounts: tenants' connections to CRM accounts, their OAuth grants and installs, and
provider apps (one webhook URL for every account that installed the app)."""
