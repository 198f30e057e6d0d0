"""The health app's API: alerts, telemetry history."""
