"""The integration port: the interface onceflow owns toward CRM vendors, and its adapters."""
